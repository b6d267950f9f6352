"""The image -> views and ``<image>`` tokens follow the reference's rules: the released modes'
token counts (hand-computed from its formula), Gundam's tile grids (its aspect-ratio choice and
tie rule), the padded global view, and the tiny checkpoint's encoder end to end (tools/
reference_equivalence.py runs the reference's own tiling code against these on several sizes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mm_pack_deepseek_ocr.processing import GREY, normalised, tile_grid, views


def picture(width: int, height: int, colour=(200, 30, 30)) -> Image.Image:  # type: ignore[no-untyped-def]
    return Image.new("RGB", (width, height), colour)


@pytest.mark.parametrize(
    ("mode", "base", "size", "crop", "tokens"),
    [("Tiny", 512, 512, False, 8 * 9 + 1), ("Small", 640, 640, False, 10 * 11 + 1), ("Base", 1024, 1024, False, 16 * 17 + 1), ("Large", 1280, 1280, False, 20 * 21 + 1)],
)
def test_the_released_modes_token_counts(mode: str, base: int, size: int, crop: bool, tokens: int) -> None:
    glob, tiles, grid, count = views(picture(900, 600), base, size, crop, 16)
    assert (count, tiles, grid, glob.size) == (tokens, [], (1, 1), (size, size)), mode


@pytest.mark.parametrize(
    ("size", "grid"),
    [((600, 500), None), ((1200, 800), (3, 2)), ((2000, 700), (3, 1)), ((700, 2000), (1, 3)), ((1000, 1000), (2, 2)), ((2000, 2000), (3, 3)), ((641, 640), (2, 2))],
)
def test_gundam_tiles_as_the_reference(size: tuple[int, int], grid: tuple[int, int] | None) -> None:
    """Gundam (1024 global, 640 tiles, 2..9 tiles): no tiles up to 640 on both sides; else the
    grid nearest the image's aspect, a tie going to the larger grid only when the image covers
    more than half of it (1000 x 1000 stays 2 x 2, 2000 x 2000 takes 3 x 3)."""
    glob, tiles, got, count = views(picture(*size), 1024, 640, True, 16)
    assert glob.size == (1024, 1024)
    if grid is None:
        assert (tiles, got, count) == ([], (1, 1), 273)
        return
    across, down = grid
    assert got == grid and len(tiles) == across * down and all(t.size == (640, 640) for t in tiles)
    assert count == 16 * 17 + 1 + (down * 10) * (across * 10 + 1)
    assert tile_grid(size, 640, 2, 9) == grid


def test_the_global_view_is_fitted_and_padded_grey_and_small_views_stretched() -> None:
    glob, _, _, _ = views(picture(100, 50), 64, 40, True, 4)
    pixels = normalised([glob])[0]
    assert np.allclose(pixels[:, 0, 0], (GREY[0] / 255 - 0.5) / 0.5) and np.allclose(pixels[:, 32, 32], [(c / 255 - 0.5) / 0.5 for c in (200, 30, 30)])
    small, _, _, _ = views(picture(100, 50), 40, 40, False, 4)  # 3 x 3 tokens: stretched, as the reference's Tiny and Small
    assert np.asarray(small)[0, 0].tolist() == [200, 30, 30]
    large, _, _, _ = views(picture(1000, 500), 1024, 1024, False, 16)  # Base: fitted and padded
    assert np.asarray(large)[0, 0].tolist() == list(GREY)


def test_the_encoder_expands_images_the_model_takes(tiny_dir: Path, tmp_path: Path) -> None:
    """Through the kit's encoder on the tiny geometry (64-pixel global view, 40-pixel tiles): a
    wide image gets tiles, a small one none, and the model's image features fill every slot."""
    from mm_pack_deepseek_ocr.family import FAMILY, DeepseekOcrData, DeepseekOcrRunConfig, images_of
    from mm_pack_deepseek_ocr.model import DeepseekOcrForCausalLM

    class Ctx:
        config = DeepseekOcrRunConfig(data=DeepseekOcrData(base_size=64, image_size=40, image_max_tiles=4))  # the tiny preset's

    picture(120, 50).save(tmp_path / "wide.png")
    picture(30, 30).save(tmp_path / "small.png")
    images = images_of(Ctx(), tiny_dir, 7)
    wide, small = images(tmp_path / "wide.png"), images(tmp_path / "small.png")
    assert wide.fields["images_spatial_crop"].tolist() == [[2, 1]] and wide.fields["pixel_values_local"].shape == (2, 3, 40, 40)
    assert "pixel_values_local" not in small.fields and len(small.ids) == 4 * 5 + 1
    model = DeepseekOcrForCausalLM.from_pretrained(tiny_dir)
    samples = [{k: torch.as_tensor(v) for k, v in p.fields.items()} for p in (wide, small)]
    batch = {name: torch.cat([s[name] for s in samples if name in s]) for name in FAMILY.media_fields}
    with torch.no_grad():
        features = model.model.image_features(batch["pixel_values"], batch["images_spatial_crop"].long(), batch["pixel_values_local"])
    assert features.shape[0] == len(wide.ids) + len(small.ids) == 3 * (2 * 3 + 1) + 21 + 21
    # the reference's order: the tiles' rows (each closed by a newline), the global view's, the separator
    newline, sep = model.model.image_newline, model.model.view_seperator
    assert torch.equal(features[6], newline) and torch.equal(features[21 + 4], newline) and torch.equal(features[len(wide.ids) - 1], sep)


def test_a_rank_without_tiles_calls_the_towers_as_one_with_tiles(tiny_dir: Path) -> None:
    """Under FSDP2 (crop mode, several ranks) a micro-batch without tiles runs the DeepEncoder a
    second time, as a rank holding tiles does, and its features stay exactly what they were."""
    from mm_pack_deepseek_ocr.model import DeepseekOcrForCausalLM

    model = DeepseekOcrForCausalLM.from_pretrained(tiny_dir)
    calls = []
    model.model.sam_model.register_forward_hook(lambda *a: calls.append(1))
    pixels, crop = torch.randn(2, 3, 64, 64), torch.ones(2, 2, dtype=torch.long)
    with torch.no_grad():
        alone = model.model.image_features(pixels, crop)
        model.model.always_tiles = True
        uniform = model.model.image_features(pixels, crop)
    assert len(calls) == 3 and torch.equal(alone, uniform)
