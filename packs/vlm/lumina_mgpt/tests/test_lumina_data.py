"""Preprocessing equals ChameleonProcessor for image questions (tokens and pixels, the
separator that ends a turn), through Lumina-mGPT's conversation template; a generation sample
is the prompt then the picture in Lumina's layout, its codes the model's own VQ encoder's;
LLaMA-Factory's JSON (image, text-only and text-to-image samples mixed) goes in unedited."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmcore.data import Sample, Turn
from mmcore.testing import preprocessed
from mmcore.testing.media import write_noise, write_wild_image_mllm
from mm_pack_lumina_mgpt.family import LuminaRunConfig, encoder, processor


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


class _Ctx:
    config = LuminaRunConfig()


SIZES = [(20, 12), (32, 32), (90, 40), (30, 100), (200, 200)]


def test_image_questions_become_what_the_processor_makes(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    proc = processor(tiny_dir)
    enc = encoder(_Ctx(), tiny_dir, tokenizer)
    sep = tokenizer.sep_token
    for i, size in enumerate(SIZES):
        write_noise(tmp_path / f"{i}.png", size, i)
        image = Image.open(tmp_path / f"{i}.png").convert("RGB")
        want = proc(text="<image>What colour?", images=[image], return_tensors="np")  # the processor appends the separator
        got = enc.encode_prompt(Sample("x.json", i, [Turn("user", "<image>What colour?")], {"images": [tmp_path / f"{i}.png"]}))
        assert got.input_ids == want["input_ids"][0].tolist(), size
        assert np.array_equal(got.tensors["pixel_values"].numpy(), want["pixel_values"]), size
        want = proc(text=f"<image>What colour?{sep}red", images=[image], return_tensors="np")
        got = enc.encode(Sample("x.json", i, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [tmp_path / f"{i}.png"]}))
        assert got.input_ids == want["input_ids"][0].tolist(), size
        assert tokenizer.decode([t for t, label in zip(got.input_ids, got.labels) if label != -100]).strip() == "red" + sep
    assert got.input_ids.count(proc.image_token_id) == 16 and got.input_ids[0] == tokenizer.bos_token_id


def test_a_generation_sample_is_the_prompt_then_the_picture_in_luminas_layout(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from PIL import Image
    from transformers import ChameleonForConditionalGeneration

    from mm_pack_lumina_mgpt.pictures import center_crop

    write_noise(tmp_path / "target.png", (40, 30), 7)
    proc = processor(tiny_dir)
    enc = encoder(_Ctx(), tiny_dir, tokenizer)
    got = enc.encode(Sample("x.json", 0, [Turn("user", "a red square"), Turn("assistant", "<image>")], {"images": [tmp_path / "target.png"]}))
    t = tokenizer.convert_tokens_to_ids
    prompt = tokenizer("a red square" + tokenizer.sep_token)["input_ids"]
    assert got.input_ids[: len(prompt)] == prompt and set(got.labels[: len(prompt)]) == {-100}
    picture = got.input_ids[len(prompt) :]
    assert got.labels[len(prompt) :] == picture  # the whole picture is learnt, and the separator after it
    # 40x30 -> the 32x32 crop (2 x 2 units of 16 pixels), 4 x 4 codes, a new-line after each row
    assert picture[:3] == [t("<racm3:break>"), t("<reserved08802>"), t("<reserved08802>")] and picture[-2:] == [t("<eoss>"), t(tokenizer.sep_token)]
    rows = torch.tensor(picture[3:-2]).view(4, 5)
    assert (rows[:, -1] == t("<reserved08799>")).all()
    model = ChameleonForConditionalGeneration.from_pretrained(tiny_dir).eval()
    pixels = proc.image_processor(center_crop(Image.open(tmp_path / "target.png").convert("RGB"), (32, 32)), do_resize=False, do_center_crop=False, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        assert rows[:, :-1].flatten().tolist() == model.model.get_image_tokens(pixels)[0].tolist()


def test_llama_factory_json_with_mixed_samples_preprocesses_unedited(tmp_path: Path) -> None:
    """LLaMA-Factory's MLLM JSON as written: two images in a multi-turn sample, a system prompt,
    text-only samples and a text-to-image sample mixed in, paths relative to the file."""
    data = preprocessed(
        "lumina-mgpt",
        tmp_path / "r",
        write_wild_image_mllm(tmp_path / "data", {"messages": [{"role": "user", "content": "a green circle"}, {"role": "assistant", "content": "<image>"}], "images": ["imgs/word.jpg"]}),
    )
    from transformers import AutoTokenizer

    eoss = AutoTokenizer.from_pretrained(tmp_path / "r/download/model").convert_tokens_to_ids("<eoss>")
    kinds = sorted((("pixel_values" in data[i]) and len(data[i]["pixel_values"]), bool((data[i]["labels"] == eoss).any())) for i in range(len(data)))
    assert kinds == [(0, False), (0, False), (0, True), (1, False), (2, False)], kinds
