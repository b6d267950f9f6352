"""The tiling and the ``<image>`` expansion follow the public processor's rules: the released
geometry (384-pixel views, 14-pixel patches, 2 x 2 downsampling: 14 x 14 tokens a view) with
hand-computed token counts, and the tiny checkpoint's encoder end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mm_pack_deepseek_vl2.processing import best_resolution, image_tokens, views

# deepseek-vl2-tiny's candidate_resolutions (config.json), multiples of the 384-pixel view
PUBLIC = [
    [384, 384],
    [384, 768],
    [768, 384],
    [384, 1152],
    [1152, 384],
    [384, 1536],
    [1536, 384],
    [768, 768],
    [384, 1920],
    [1920, 384],
    [384, 2304],
    [2304, 384],
    [768, 1152],
    [1152, 768],
    [384, 2688],
    [2688, 384],
    [384, 3072],
    [3072, 384],
    [768, 1536],
    [1536, 768],
    [384, 3456],
    [3456, 384],
    [1152, 1152],
]


# (width, height) -> (tiles across, down), tokens: 14 x 15 (global, a newline a row) + 1 (separator)
# + (14 down) x (14 across + 1) (tiles, a newline a row), worked out by hand from the rules
@pytest.mark.parametrize(
    ("size", "grid", "tokens"),
    [
        ((384, 384), (1, 1), 210 + 1 + 210),  # exactly one view
        ((100, 50), (1, 1), 421),  # every candidate keeps it all: the least padding wins
        ((768, 384), (2, 1), 210 + 1 + 14 * 29),  # a 2:1 image fills [768, 384] exactly
        ((1000, 1000), (3, 3), 210 + 1 + 42 * 43),  # only [1152, 1152] keeps all of it
        ((300, 1200), (1, 4), 210 + 1 + 56 * 15),  # [384, 1536] keeps all, with the least padding
    ],
)
def test_tiles_and_token_counts_follow_the_public_rules(size, grid, tokens) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    width, height = best_resolution(size, PUBLIC)
    assert (width // 384, height // 384) == grid
    assert image_tokens(*grid, per_side=-(-(384 // 14) // 2)) == tokens
    made, got = views(Image.new("RGB", size, (200, 10, 10)), 384, PUBLIC, crop=True)
    assert got == grid and len(made) == 1 + grid[0] * grid[1] and all(v.size == (384, 384) for v in made)
    _, single = views(Image.new("RGB", size), 384, PUBLIC, crop=False)
    assert single == (1, 1)


def test_the_encoder_writes_the_layout_the_model_reads(tiny_dir: Path, tmp_path: Path) -> None:
    """Through the chat template: the image's tokens, its views (global first, padded with the
    mean grey, normalised to [-1, 1]) and grid; the model takes exactly that many features."""
    import torch
    from transformers import AutoTokenizer

    from mmcore.data import Sample, Turn
    from mmcore.testing.media import write_noise
    from mmcore.testing.packing import encoded
    from mm_pack_deepseek_vl2.family import FAMILY, DeepseekVL2Config, encoder

    class Ctx:
        config = DeepseekVL2Config()

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    write_noise(tmp_path / "wide.png", (80, 30), 0)  # 35-pixel views: [105, 35] keeps it all -> 3 x 1
    sample = Sample("x", 0, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [tmp_path / "wide.png"]})
    (row,) = encoded(encoder(Ctx(), tiny_dir, tokenizer), [sample])
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    assert row["images_spatial_crop"].tolist() == [[3, 1]]
    assert int((row["input_ids"] == image_id).sum()) == image_tokens(3, 1, 3) == 3 * 4 + 1 + 3 * 10
    pixels = row["pixel_values"]
    assert tuple(pixels.shape) == (4, 3, 35, 35) and float(pixels.min()) >= -1 and float(pixels.max()) <= 1
    assert np.allclose(pixels[0, :, 0, 0].numpy(), 127 / 255 * 2 - 1)  # the global view's padding row
    text = tokenizer.decode(row["input_ids"][row["input_ids"] != image_id])
    assert text.startswith("<｜begin▁of▁sentence｜><|User|>: \nWhat colour?\n\n<|Assistant|>:") and text.endswith("red<｜end▁of▁sentence｜>"), text
    batch = FAMILY.collate([row], FAMILY.token_ids_of(tokenizer))
    with torch.no_grad():
        assert torch.isfinite(FAMILY.loss_sum(FAMILY.build_model(tiny_dir).eval(), batch))
