"""Preprocessing equals Janus's own processor (image tokens and pixels, the begin-of-sentence
token and the default system prompt it adds) through its chat template; generation samples
equal the processor's image-mode prompt followed by the VQ model's ids of the picture;
LLaMA-Factory's JSON (image, text-only and text-to-image samples mixed) goes in unedited."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmcore.data import Sample, Turn
from mmcore.testing import preprocessed
from mmcore.testing.media import write_noise, write_wild_image_mllm
from mm_pack_janus.family import JanusRunConfig, encoder, processor


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


class _Ctx:
    config = JanusRunConfig()


# (width, height): smaller than the tower's 32 pixels, exactly, wide, tall, large
SIZES = [(20, 12), (32, 32), (90, 40), (30, 100), (200, 200)]


def test_images_of_several_sizes_become_what_the_processor_makes(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    proc = processor(tiny_dir)
    assert proc.use_default_system_prompt  # as deepseek-community's processor: the tiny preset keeps it
    enc = encoder(_Ctx(), tiny_dir, tokenizer)
    for i, size in enumerate(SIZES):
        write_noise(tmp_path / f"{i}.png", size, i)
        image = Image.open(tmp_path / f"{i}.png").convert("RGB")
        user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
        # the prompt a user's generate() call gets from JanusProcessor, token for token
        want = proc(text=proc.apply_chat_template(user, add_generation_prompt=True), images=[image], return_tensors="np")
        got = enc.encode_prompt(Sample("x.json", i, [Turn("user", "<image>What colour?")], {"images": [tmp_path / f"{i}.png"]}))
        assert got.input_ids == want["input_ids"][0].tolist(), size
        assert np.array_equal(got.tensors["pixel_values"].numpy(), want["pixel_values"]), size
        # the conversation: the processor's text plus the end-of-sentence token closing the answer
        answer = [*user, {"role": "assistant", "content": [{"type": "text", "text": "red"}]}]
        want = proc(text=proc.apply_chat_template(answer) + tokenizer.eos_token, images=[image], return_tensors="np")
        got = enc.encode(Sample("x.json", i, [Turn("user", "<image>What colour?"), Turn("assistant", "red")], {"images": [tmp_path / f"{i}.png"]}))
        assert got.input_ids == want["input_ids"][0].tolist(), size
        supervised = tokenizer.decode([t for t, label in zip(got.input_ids, got.labels) if label != -100])
        assert supervised.strip() == "red" + tokenizer.eos_token
    assert got.input_ids.count(tokenizer.convert_tokens_to_ids("<image_placeholder>")) == 16 and got.input_ids[0] == tokenizer.bos_token_id


def test_a_generation_sample_is_the_image_mode_prompt_then_the_vq_ids(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from PIL import Image
    from transformers import JanusForConditionalGeneration

    write_noise(tmp_path / "target.png", (40, 30), 7)
    proc = processor(tiny_dir)
    enc = encoder(_Ctx(), tiny_dir, tokenizer)
    got = enc.encode(Sample("x.json", 0, [Turn("user", "a red square"), Turn("assistant", "<image>")], {"images": [tmp_path / "target.png"]}))
    model = JanusForConditionalGeneration.from_pretrained(tiny_dir).eval()
    vocab = model.config.text_config.vocab_size
    prompt = proc(text=proc.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "a red square"}]}], add_generation_prompt=True), generation_mode="image", return_tensors="pt")
    n = len(prompt["input_ids"][0])
    assert got.input_ids[:n] == prompt["input_ids"][0].tolist() and got.input_ids[n - 1] == tokenizer.convert_tokens_to_ids("<begin_of_image>")
    pixels = proc.image_processor(Image.open(tmp_path / "target.png").convert("RGB"), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        codes = model.model.vqmodel.encode(pixels).image_tokens.flatten().tolist()
    assert got.input_ids[n:] == [vocab + c for c in codes] == got.labels[n:] and len(codes) == 16
    assert set(got.labels[:n]) == {-100}
    assert isinstance(enc.truncate(got, n + 3), str)  # cutting through the picture is a reason, not a cut


def test_llama_factory_json_preprocesses_without_edits(tmp_path: Path) -> None:
    """LLaMA-Factory's MLLM JSON as written: multi-turn with two images, a system prompt, text-only
    samples and a text-to-image sample mixed in, paths relative to the file."""
    data = preprocessed(
        "janus",
        tmp_path / "r",
        write_wild_image_mllm(tmp_path / "wild", {"messages": [{"role": "user", "content": "a green circle"}, {"role": "assistant", "content": "<image>"}], "images": ["imgs/word.jpg"]}),
    )
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tmp_path / "r/download/model").text_config.vocab_size
    kinds = sorted((("pixel_values" in data[i]) and len(data[i]["pixel_values"]), bool((data[i]["labels"] >= vocab).any())) for i in range(len(data)))
    assert kinds == [(0, False), (0, False), (0, True), (1, False), (2, False)], kinds
