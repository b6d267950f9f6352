"""Preprocessing equals transformers' Qwen3VLProcessor: ids, pixels, the video's timestamps."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from mmcore.data.mllm import Sample, Turn
from mmcore.testing.media import write_image, write_video, write_wild_mllm
from mm_pack_qwen3vl.data import Encoder
from mm_pack_qwen3vl.family import Qwen3VLData


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def processor(tiny_dir: Path, tokenizer, cfg: Qwen3VLData):  # type: ignore[no-untyped-def]
    """The family's processor with the image processor the checkpoint saved, at ``cfg``'s pixel
    budget. Its video processor needs torchvision (not installable beside the CPU torch): the
    processor is built without one, and its video code reads the two numbers it needs."""
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.processing_utils import ProcessorMixin

    class WithoutVideo(Qwen3VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):  # type: ignore[no-untyped-def]
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            self.video_processor = types.SimpleNamespace(merge_size=2, temporal_patch_size=2)
            for name in ("image", "video", "vision_start", "vision_end"):
                token = f"<|{name}_pad|>" if name in ("image", "video") else f"<|{name}|>"
                setattr(self, f"{name}_token", token)
                setattr(self, f"{name}_token_id", tokenizer.convert_tokens_to_ids(token))

    images = Qwen2VLImageProcessorPil.from_pretrained(tiny_dir, min_pixels=cfg.image_min_pixels, max_pixels=cfg.image_max_pixels)
    return WithoutVideo(image_processor=images, tokenizer=tokenizer, chat_template=tokenizer.chat_template)


def test_an_image_conversation_equals_the_processor(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    write_image(tmp_path / "a.png", (10, 200, 30), size=(100, 70))
    cfg = Qwen3VLData(image_max_pixels=96 * 96)
    turns = [Turn("user", "<image>What colour is the square?"), Turn("assistant", "green")]
    encoded = Encoder(tokenizer, cfg).encode(Sample("x.json", 0, turns, {"images": [tmp_path / "a.png"]}))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}, {"role": "assistant", "content": [{"type": "text", "text": "green"}]}]
    proc = processor(tiny_dir, tokenizer, cfg)
    text = proc.apply_chat_template(messages, tokenize=False)
    want = proc(text=[text], images=[Image.open(tmp_path / "a.png").convert("RGB")], return_tensors="np")
    assert encoded.input_ids == want["input_ids"][0].tolist()
    assert np.array_equal(encoded.tensors["pixel_values"].numpy(), want["pixel_values"])
    assert encoded.tensors["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
    supervised = tokenizer.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != -100])
    assert supervised == "green<|im_end|>"


def test_a_video_gets_a_timestamp_before_each_temporal_patch_as_the_processor_writes(tiny_dir: Path, tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers.video_utils import VideoMetadata

    from mm_qwen_vision import sample_video

    write_video(tmp_path / "v.mp4", frames=12, fps=4)  # 3 s; at 2 fps: source frames 0 2 4 6 8 10
    cfg = Qwen3VLData(video_max_pixels=64 * 64)
    encoded = Encoder(tokenizer, cfg).encode(Sample("x.json", 0, [Turn("user", "<video>What happens?"), Turn("assistant", "it grows")], {"videos": [tmp_path / "v.mp4"]}))
    grid = encoded.tensors["video_grid_thw"].tolist()
    assert grid[0][0] == 3  # six frames, two per temporal patch
    video = sample_video(tmp_path / "v.mp4", cfg.video_fps, cfg.video_max_frames)
    proc = processor(tiny_dir, tokenizer, cfg)
    metadata = VideoMetadata(total_num_frames=12, fps=video.source_fps, frames_indices=video.indices)
    expanded = proc.replace_video_token({"video_grid_thw": np.array(grid), "video_metadata": [metadata]}, 0)
    # each temporal patch: the mean time of its two frames, (0 + 2) / 2 / 4 fps = 0.25 s, ...
    assert [part.split(">")[0] for part in expanded.split("<")[1:] if "seconds" in part] == ["0.2 seconds", "1.2 seconds", "2.2 seconds"]
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}, {"role": "assistant", "content": [{"type": "text", "text": "it grows"}]}], tokenize=False
    )
    want = tokenizer(text.replace("<|video_pad|>", expanded, 1), add_special_tokens=False)["input_ids"]
    assert encoded.input_ids == want


def test_real_world_mllm_json_preprocesses_without_edits(tmp_path: Path) -> None:
    """LLaMA-Factory's MLLM JSON as written (multi-turn, two images, a video, text only, a
    system prompt) through the preprocess stage; a missing image is a one-line error naming it,
    or with ``on_bad_sample=skip`` a counted skip."""
    from mmcore.errors import MmcoreError
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    root = write_wild_mllm(tmp_path / "wild").parent
    plugins = Plugins.load()
    runner = make_runner(plugins, "qwen3vl", tmp_path / "r", preset="tiny", overrides=[f"data.datasets=[{root / 'data.json'}]"])
    runner.run_stage("download")
    runner.run_stage("convert")
    with pytest.raises(MmcoreError) as failed:
        runner.run_stage("preprocess")
    line = failed.value.one_line()
    assert "\n" not in line and "data.json" in line and "sample 3" in line and "imgs/missing.jpg" in line, line
    skip = make_runner(plugins, "qwen3vl", tmp_path / "r", preset="tiny", overrides=[f"data.datasets=[{root / 'data.json'}]", "data.on_bad_sample=skip"])
    result = skip.run_stage("preprocess")
    from mmcore.data.shards import ShardDataset

    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    assert len(data) == 3 and (tmp_path / "r/preprocess/bad_samples.jsonl").read_text().count("\n") == 1, result
    assert len(data[0]["image_grid_thw"]) == 2 and len(data[1]["video_grid_thw"]) == 1 and "pixel_values" not in data[2]
