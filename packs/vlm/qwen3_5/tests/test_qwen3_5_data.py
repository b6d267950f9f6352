"""Preprocessing equals transformers' Qwen3VLProcessor (Qwen3.5's processor class) over the
family's Qwen3_5Tokenizer; LLaMA-Factory's MLLM JSON runs unedited; hub checkpoints' extra
multi-token-prediction head is left out of conversion as transformers leaves it out."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from mmcore.data.mllm import Sample, Turn
from mmcore.testing.media import write_image, write_video, write_wild_mllm
from mm_pack_qwen3_5.family import MEAN_STD, Qwen3_5Data
from mm_qwen_vision.qwen3vl_processor import Qwen3VLEncoder


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def processor(tiny_dir: Path, tokenizer, cfg: Qwen3_5Data):  # type: ignore[no-untyped-def]
    """``Qwen3VLProcessor`` (what ``AutoProcessor`` maps ``qwen3_5`` to) with the saved image
    processor at ``cfg``'s pixel budget. Its video processor needs torchvision (not installable
    beside the CPU torch): built without one, its video code reads the two numbers it needs."""
    from transformers import Qwen3VLProcessor
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.processing_utils import ProcessorMixin

    assert PROCESSOR_MAPPING_NAMES["qwen3_5"] == "Qwen3VLProcessor"

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

    assert type(tokenizer).__name__ == "Qwen3_5Tokenizer"
    write_image(tmp_path / "a.png", (10, 200, 30), size=(100, 70))
    cfg = Qwen3_5Data(image_max_pixels=96 * 96)
    turns = [Turn("user", "<image>What colour is the square?"), Turn("assistant", "green")]
    encoded = Qwen3VLEncoder(tokenizer, cfg, MEAN_STD).encode(Sample("x.json", 0, turns, {"images": [tmp_path / "a.png"]}))
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

    write_video(tmp_path / "v.mp4", frames=12, fps=4)
    cfg = Qwen3_5Data(video_max_pixels=64 * 64)
    encoded = Qwen3VLEncoder(tokenizer, cfg, MEAN_STD).encode(Sample("x.json", 0, [Turn("user", "<video>What happens?"), Turn("assistant", "it grows")], {"videos": [tmp_path / "v.mp4"]}))
    grid = encoded.tensors["video_grid_thw"].tolist()
    video = sample_video(tmp_path / "v.mp4", cfg.video_fps, cfg.video_max_frames)
    proc = processor(tiny_dir, tokenizer, cfg)
    metadata = VideoMetadata(total_num_frames=12, fps=video.source_fps, frames_indices=video.indices)
    expanded = proc.replace_video_token({"video_grid_thw": np.array(grid), "video_metadata": [metadata]}, 0)
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}, {"role": "assistant", "content": [{"type": "text", "text": "it grows"}]}], tokenize=False
    )
    assert encoded.input_ids == tokenizer(text.replace("<|video_pad|>", expanded, 1), add_special_tokens=False)["input_ids"]


def test_real_world_mllm_json_preprocesses_without_edits(tmp_path: Path) -> None:
    """LLaMA-Factory's MLLM JSON as written (multi-turn, two images, a video, text only, a
    system prompt, a missing image) through preprocess with ``on_bad_sample=skip``."""
    from mmcore.data.shards import ShardDataset
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    root = write_wild_mllm(tmp_path / "wild").parent
    runner = make_runner(Plugins.load(), "qwen3_5", tmp_path / "r", preset="tiny", overrides=[f"data.datasets=[{root / 'data.json'}]", "data.on_bad_sample=skip"])
    for stage in ("download", "convert", "preprocess"):
        runner.run_stage(stage)
    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    assert len(data) == 3 and (tmp_path / "r/preprocess/bad_samples.jsonl").read_text().count("\n") == 1
    assert len(data[0]["image_grid_thw"]) == 2 and len(data[1]["video_grid_thw"]) == 1 and "pixel_values" not in data[2]


def test_the_hub_checkpoints_mtp_head_is_left_out_and_the_rest_round_trips(tiny_dir: Path, tmp_path: Path) -> None:
    """Released Qwen3.5 checkpoints hold ``mtp.*`` tensors that ``Qwen3_5ForConditionalGeneration``
    does not have (``_keys_to_ignore_on_load_unexpected``): conversion leaves them out, the model
    loads as transformers loads it, and everything else comes back bit for bit."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5ForConditionalGeneration

    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp
    from mm_pack_qwen3_5.family import ADAPTER, FAMILY

    hub = tmp_path / "hub"
    shutil.copytree(tiny_dir, hub)
    (shard,) = hub.glob("*.safetensors")
    tensors = load_file(shard)
    save_file({**tensors, "mtp.fc.weight": torch.ones(64, 128), "mtp.norm.weight": torch.ones(64)}, shard, metadata={"format": "pt"})
    reference = Qwen3_5ForConditionalGeneration.from_pretrained(hub).eval()
    hf_to_dcp(hub, tmp_path / "dcp", ADAPTER)
    model = FAMILY.build_model(hub)
    load_converted(model, tmp_path / "dcp")
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=ids).logits, reference(input_ids=ids).logits)
    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", ADAPTER)
    assert compare_hf(tiny_dir, tmp_path / "back") == []
