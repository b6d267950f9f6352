"""Preprocessing equals Kimi-K2.5's own processor (``Kimi_K25Processor``: image tokens and
pixels) through the tokenizer's chat template; the image geometry is the library's
``navit_resize``; LLaMA-Factory's JSON (image and text-only samples mixed) goes in unedited.

transformers' image processor for the family is a torchvision one, which does not load beside the
CPU torch: the pack's PIL one does the same steps, and its geometry is checked against the
library's own function (read from its source, which imports torchvision at the top)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from mmcore.data import Sample, Turn
from mmcore.testing import preprocessed
from mmcore.testing.media import write_noise, write_wild_image_mllm
from mmcore.testing.packing import encoded
from mm_pack_kimi_k25.family import KimiK25Config, encoder, processor


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


class _Ctx:
    config = KimiK25Config()


def test_the_image_geometry_is_the_librarys_navit_resize() -> None:
    """transformers' ``navit_resize`` (the library's source, run as it is) and the pack's agree on
    sizes past the patch budget, past the side limit, tiny and odd ones."""
    import transformers.models.kimi_k25 as kimi

    from mm_pack_kimi_k25.image_processor import navit_resize

    source = (Path(kimi.__file__).parent / "image_processing_kimi_k25.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "navit_resize")
    scope: dict = {"math": math}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "navit_resize", "exec"), scope)
    for h, w in [(1, 1), (13, 200), (50, 90), (96, 96), (300, 70), (1000, 1000), (4000, 30), (777, 1234)]:
        for patch, merge, budget, side in [(14, 2, 16384, 512), (4, 2, 160, 16), (8, 2, 256, 16), (14, 2, 1024, 64)]:
            assert navit_resize(h, w, patch, merge, budget, side) == scope["navit_resize"](h, w, patch, merge, budget, side), (h, w, patch)


# (width, height): smaller than a merged patch, odd sizes that pad, past the tiny side limit
# (64 pixels) and past the patch budget (160 patches before padding: padded grids may hold more, as the library's do)
SIZES = [(6, 5), (60, 40), (64, 64), (200, 90), (70, 250)]


def test_images_of_several_sizes_become_what_the_processor_makes(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    proc = processor(tiny_dir)
    enc = encoder(_Ctx(), tiny_dir, tokenizer)
    grids = []
    for i, size in enumerate(SIZES):
        write_noise(tmp_path / f"{i}.png", size, i)
        got = enc.encode(Sample("x.json", i, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [tmp_path / f"{i}.png"]}))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}, {"role": "assistant", "content": [{"type": "text", "text": "red"}]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        want = proc(text=text, images=[Image.open(tmp_path / f"{i}.png").convert("RGB")], add_special_tokens=False, return_tensors="np")
        assert got.input_ids == want["input_ids"][0].tolist(), size
        assert np.array_equal(got.tensors["pixel_values"].numpy(), want["pixel_values"]), size
        assert got.tensors["image_grid_thw"].tolist() == want["image_grid_thw"].tolist(), size
        t, h, w = want["image_grid_thw"][0]
        assert got.input_ids.count(proc.image_token_id) == h * w // 4 and h % 2 == 0 and w % 2 == 0 and max(h, w) <= 16
        supervised = tokenizer.decode([t for t, label in zip(got.input_ids, got.labels) if label != -100])
        assert supervised == "</think>red<|im_end|>"  # the prompt ends in "<think>" (thinking mode), as the family's template does
        grids.append((int(h), int(w)))
    assert grids[0] == (2, 2) and grids[1][0] * 4 >= 40  # a tiny image pads to one merged patch; others are not upscaled


def test_the_model_reads_what_preprocessing_wrote(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A batch of two images and a text-only sample: collated, the model's token count agrees."""
    import torch

    from mm_pack_kimi_k25.family import FAMILY

    write_noise(tmp_path / "wide.png", (200, 90), 0)
    write_noise(tmp_path / "small.png", (30, 30), 1)
    enc = encoder(_Ctx(), tiny_dir, tokenizer)
    samples = [
        Sample("x", 0, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [tmp_path / "wide.png"]}),
        Sample("x", 1, [Turn("user", "Say hi."), Turn("assistant", "hi")]),
        Sample("x", 2, [Turn("user", "<image>What colour?"), Turn("assistant", "blue")], {"images": [tmp_path / "small.png"]}),
    ]
    rows = encoded(enc, samples)
    batch = FAMILY.collate(rows, FAMILY.token_ids_of(tokenizer))
    assert batch["image_grid_thw"].shape == (2, 3)
    model = FAMILY.build_model(tiny_dir).eval()
    with torch.no_grad():
        assert torch.isfinite(FAMILY.loss_sum(model, batch))


def test_llama_factory_json_preprocesses_without_edits(tmp_path: Path) -> None:
    """LLaMA-Factory's MLLM JSON as written: multi-turn with two images, a system prompt, text-only
    samples mixed in, paths relative to the file."""
    data = preprocessed("kimi-k2.5", tmp_path / "r", write_wild_image_mllm(tmp_path / "wild"))
    images = sorted(len(data[i]["image_grid_thw"]) if "image_grid_thw" in data[i] else 0 for i in range(len(data)))
    assert images == [0, 0, 1, 2], images
