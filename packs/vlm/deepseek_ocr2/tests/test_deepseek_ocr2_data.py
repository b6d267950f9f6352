"""Preprocessing equals DeepSeek-OCR-2's own processor (image tokens and pixels, the global view
and the tiles of its crop mode), through the tokenizer's chat template; LLaMA-Factory's JSON
(image and text-only samples mixed) goes in unedited."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmcore.data import Sample, Turn
from mmcore.testing import preprocessed
from mmcore.testing.media import write_noise, write_wild_image_mllm
from mmcore.testing.packing import encoded
from mm_pack_deepseek_ocr2.family import DeepseekOcr2Config, DeepseekOcr2Data, encoder, processor


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


class _Ctx:
    def __init__(self, **data) -> None:  # type: ignore[no-untyped-def]
        self.config = DeepseekOcr2Config(data=DeepseekOcr2Data(**data))


# (width, height): smaller than a tile (global view only), exactly a tile, wide, tall, large
# square -- the tiny processor's tile is 96 pixels, its global view 128
SIZES = [(60, 40), (96, 96), (200, 90), (70, 250), (300, 300)]


@pytest.mark.parametrize("crop", [True, False])
def test_images_of_several_sizes_become_what_the_processor_makes(tiny_dir: Path, tokenizer, tmp_path: Path, crop: bool) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    proc = processor(tiny_dir)
    enc = encoder(_Ctx(image_crop=crop), tiny_dir, tokenizer)
    tiles_seen, counts = 0, []
    for i, size in enumerate(SIZES):
        write_noise(tmp_path / f"{i}.png", size, i)
        turns = [Turn("user", "<image>Free OCR."), Turn("assistant", "red")]
        got = enc.encode(Sample("x.json", i, turns, {"images": [tmp_path / f"{i}.png"]}))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Free OCR."}]}, {"role": "assistant", "content": [{"type": "text", "text": "red"}]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        want = proc(text=text, images=[Image.open(tmp_path / f"{i}.png").convert("RGB")], add_special_tokens=False, crop_to_patches=crop, return_tensors="np")
        assert got.input_ids == want["input_ids"][0].tolist(), size
        assert np.array_equal(got.tensors["pixel_values"].numpy(), want["pixel_values"]), size
        assert got.tensors["num_local_patches"].tolist() == want["num_local_patches"].tolist(), size
        if "pixel_values_local" in want:
            tiles_seen += len(want["pixel_values_local"])
            assert np.array_equal(got.tensors["pixel_values_local"].numpy(), want["pixel_values_local"]), size
        else:
            assert "pixel_values_local" not in got.tensors
        supervised = tokenizer.decode([t for t, label in zip(got.input_ids, got.labels) if label != -100])
        assert supervised.lstrip() == "red" + tokenizer.eos_token  # the space after "<|Assistant|>:" joins the answer's first token
        counts.append(int(want["num_local_patches"][0]))
    # images wider or taller than a tile are cut into 2..6 tiles in crop mode; the others are not
    assert counts == ([0, 0] + [c for c in counts[2:] if 2 <= c <= 6] if crop else [0] * len(SIZES)), counts
    assert tiles_seen == sum(counts)


def test_the_model_reads_what_preprocessing_wrote(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A batch of a tiled image, an untiled one and text only: collated, the model's token count agrees."""
    import torch

    from mm_pack_deepseek_ocr2.family import FAMILY

    write_noise(tmp_path / "wide.png", (200, 90), 0)
    write_noise(tmp_path / "small.png", (50, 50), 1)
    enc = encoder(_Ctx(), tiny_dir, tokenizer)
    samples = [
        Sample("x", 0, [Turn("user", "<image>Free OCR."), Turn("assistant", "red")], {"images": [tmp_path / "wide.png"]}),
        Sample("x", 1, [Turn("user", "Say hi."), Turn("assistant", "hi")]),
        Sample("x", 2, [Turn("user", "<image>Free OCR."), Turn("assistant", "blue")], {"images": [tmp_path / "small.png"]}),
    ]
    rows = encoded(enc, samples)
    batch = FAMILY.collate(rows, FAMILY.token_ids_of(tokenizer))
    assert batch["pixel_values"].shape[0] == 2 and batch["pixel_values_local"].shape[0] == 2 and batch["num_local_patches"].tolist() == [2, 0]
    model = FAMILY.build_model(tiny_dir).eval()
    with torch.no_grad():
        assert torch.isfinite(FAMILY.loss_sum(model, batch))


def test_llama_factory_json_preprocesses_without_edits(tmp_path: Path) -> None:
    """LLaMA-Factory's MLLM JSON as written: multi-turn with two images, a system prompt, text-only
    samples mixed in, paths relative to the file."""
    data = preprocessed("deepseek-ocr2", tmp_path / "r", write_wild_image_mllm(tmp_path / "wild"))
    kinds = sorted(("pixel_values" in data[i], "pixel_values_local" in data[i]) for i in range(len(data)))
    assert kinds == [(False, False), (False, False), (True, False), (True, True)], kinds
