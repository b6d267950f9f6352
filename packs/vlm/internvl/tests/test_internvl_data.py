"""Preprocessing equals transformers' InternVLProcessor: tiles, thumbnail, ids; videos as frames."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcore.data import Sample, Turn
from mmcore.testing.media import write_image, write_video, write_wild_mllm
from mm_pack_internvl.data import Encoder
from mm_pack_internvl.family import FAMILY, InternVLData, use_cached_vision, vision_features


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def encoder(tiny_dir: Path, tokenizer, **data) -> Encoder:  # type: ignore[no-untyped-def]
    return Encoder(tokenizer, InternVLData(**data), FAMILY.config(tiny_dir), tiny_dir)


def processor(tiny_dir: Path, tokenizer):  # type: ignore[no-untyped-def]
    """The family's processor without its video processor (torchvision), on the PIL image processor."""
    from transformers import InternVLProcessor
    from transformers.processing_utils import ProcessorMixin

    from mm_pack_internvl.data import image_processor

    class WithoutVideo(InternVLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, image_seq_length=256, chat_template=None):  # type: ignore[no-untyped-def]
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            self.image_seq_length = image_seq_length
            self.start_image_token, self.end_image_token = tokenizer.start_image_token, tokenizer.end_image_token
            self.image_token, self.video_token = tokenizer.context_image_token, tokenizer.video_token
            self.image_token_id = tokenizer.context_image_token_id
            self.start_image_token_id, self.end_image_token_id = tokenizer.start_image_token_id, tokenizer.end_image_token_id
            self.multimodal_pattern = re.compile(f"(?P<image>{re.escape(self.image_token)})|(?P<video>{re.escape(self.video_token)})")

    return WithoutVideo(image_processor=image_processor(tiny_dir), tokenizer=tokenizer, image_seq_length=FAMILY.config(tiny_dir).image_seq_length, chat_template=tokenizer.chat_template)


def test_a_wide_image_becomes_tiles_and_a_thumbnail_as_the_processor_makes_them(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    write_image(tmp_path / "wide.png", (10, 200, 30), size=(170, 60))  # about 3:1 -> 3 x 1 tiles + thumbnail
    turns = [Turn("user", "<image>What colour is the square?"), Turn("assistant", "green")]
    encoded = encoder(tiny_dir, tokenizer, image_max_tiles=6).encode(Sample("x.json", 0, turns, {"images": [tmp_path / "wide.png"]}))
    assert encoded.tensors["pixel_values"].shape == (4, 3, 56, 56)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}, {"role": "assistant", "content": [{"type": "text", "text": "green"}]}]
    proc = processor(tiny_dir, tokenizer)
    text = proc.apply_chat_template(messages, tokenize=False)
    want = proc(text=[text], images=[Image.open(tmp_path / "wide.png").convert("RGB")], max_patches=6, return_tensors="np")
    assert encoded.input_ids == want["input_ids"][0].tolist()
    assert np.array_equal(encoded.tensors["pixel_values"].numpy(), want["pixel_values"])
    supervised = tokenizer.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != -100])
    assert supervised == "green<|im_end|>"


def test_a_video_is_one_tile_per_frame_after_its_frame_number(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_video(tmp_path / "v.mp4", frames=12, fps=4)  # 3 s: at 1 fps, 3 frames
    encoded = encoder(tiny_dir, tokenizer, video_fps=1.0).encode(Sample("x.json", 0, [Turn("user", "<video>What happens?"), Turn("assistant", "it grows")], {"videos": [tmp_path / "v.mp4"]}))
    assert encoded.tensors["pixel_values"].shape == (3, 3, 56, 56)
    proc = processor(tiny_dir, tokenizer)
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}], tokenize=False)
    frames = "\n".join(f"Frame{i + 1}: <img>{'<IMG_CONTEXT>' * 4}</img>" for i in range(3))  # the processor's replace_video_token
    want = tokenizer(text.replace("<video>", frames, 1), add_special_tokens=False)["input_ids"]
    assert encoded.input_ids[: len(want)] == want


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_loss_from_cached_features_equals_loss_from_pixels(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:
    write_image(tmp_path / "a.png", (200, 30, 30), (120, 60))
    write_video(tmp_path / "v.mp4")
    sample = encoder(tiny_dir, tokenizer, image_max_tiles=4).encode(
        Sample("f", 0, [Turn("user", "<image><video>What?"), Turn("assistant", "red")], {"images": [tmp_path / "a.png"], "videos": [tmp_path / "v.mp4"]})
    )
    raw = {"input_ids": torch.tensor(sample.input_ids), "labels": torch.tensor(sample.labels), **sample.tensors}
    ids = FAMILY.token_ids_of(tokenizer)
    model = FAMILY.build_model(tiny_dir).eval()
    with torch.no_grad():
        cached = dict(raw, pixel_values=torch.cat([vision_features(model, tile[None]) for tile in raw["pixel_values"]]))
        want = FAMILY.loss_sum(model, FAMILY.collate([raw], ids))
        got = FAMILY.loss_sum(use_cached_vision(copy.deepcopy(model)), FAMILY.collate([cached], ids))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_real_world_mllm_json_preprocesses_without_edits(tmp_path: Path) -> None:
    """LLaMA-Factory's MLLM JSON as written (multi-turn, two images, a video, text only, a system
    prompt) through the preprocess stage; a missing image is a one-line error naming it."""
    from mmcore.data import ShardDataset
    from mmcore import MmcoreError
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    root = write_wild_mllm(tmp_path / "wild").parent
    plugins = Plugins.load()
    runner = make_runner(plugins, "internvl", tmp_path / "r", preset="tiny", overrides=[f"data.datasets=[{root / 'data.json'}]"])
    runner.run_stage("download")
    runner.run_stage("convert")
    with pytest.raises(MmcoreError) as failed:
        runner.run_stage("preprocess")
    line = failed.value.one_line()
    assert "\n" not in line and "data.json" in line and "sample 3" in line and "imgs/missing.jpg" in line, line
    make_runner(plugins, "internvl", tmp_path / "r", preset="tiny", overrides=[f"data.datasets=[{root / 'data.json'}]", "data.on_bad_sample=skip"]).run_stage("preprocess")
    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    assert len(data) == 3 and data[0]["pixel_values"].shape[0] >= 2 and "pixel_values" in data[1] and "pixel_values" not in data[2]
