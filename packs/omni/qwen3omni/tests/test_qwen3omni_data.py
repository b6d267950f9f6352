"""Preprocessing: parity with transformers' Qwen3-Omni processor, clips of any length, videos on
the time axis, mixed-modality conversations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.data import Sample, Turn
from mmcore.testing.media import tone
from mm_pack_qwen3omni.data import Encoder, audio_tokens
from mm_pack_qwen3omni.family import Qwen3OmniData


@pytest.fixture(scope="module")
def parts(tiny_thinker: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    return AutoTokenizer.from_pretrained(tiny_thinker), WhisperFeatureExtractor.from_pretrained(tiny_thinker)


def test_encoding_equals_the_omni_processor_and_chat_template(parts, tiny_thinker: Path, wild: Path) -> None:  # type: ignore[no-untyped-def]
    """Token ids, pixels and mel frames as ``Qwen3OmniMoeProcessor`` makes them: a 1.3 s mp3 at
    22.05 kHz (130 frames: one full 1 s window and a remainder) beside an image."""
    from PIL import Image

    from mm_pack_qwen3omni.processor import OmniProcessorWithoutVideo
    from mmcore.data import load_audio
    from mm_qwen_vision import image_processor

    tokenizer, features = parts
    cfg = Qwen3OmniData(image_max_pixels=4096)
    root = wild.parent
    sample = Sample("x.json", 0, [Turn("user", "<image><audio>What do you see and hear?"), Turn("assistant", "red")], {"images": [root / "imgs/a.jpg"], "audios": [root / "sounds/b.mp3"]})
    encoded = Encoder(tokenizer, features, cfg).encode(sample)

    processor = OmniProcessorWithoutVideo.from_pretrained(tiny_thinker)  # what init:tiny saved
    processor.image_processor = image_processor(cfg.image_min_pixels, cfg.image_max_pixels, patch_size=16, mean_std=(0.5, 0.5))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "What do you see and hear?"}]}, {"role": "assistant", "content": "red"}]
    text = processor.apply_chat_template(messages, tokenize=False)
    want = processor(text=[text], images=[Image.open(root / "imgs/a.jpg").convert("RGB")], audio=[load_audio(root / "sounds/b.mp3")], return_tensors="np")
    assert encoded.input_ids == want["input_ids"][0].tolist()
    assert np.array_equal(encoded.tensors["pixel_values"].numpy(), want["pixel_values"])
    assert encoded.tensors["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
    frames = int(want["feature_attention_mask"][0].sum())
    assert frames == 130 and encoded.tensors["audio_feature_lengths"].tolist() == [frames]
    assert np.array_equal(encoded.tensors["input_features"].numpy(), want["input_features"][0][:, :frames].T)


def test_audio_token_count_is_the_towers_and_long_clips_are_taken(parts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The placeholder count equals transformers' ``_get_feat_extract_output_lengths`` for every
    length, and a 31 s clip (Qwen2.5-Omni's limit is 30 s) encodes: the tower reads 1 s windows."""
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    from mmcore.data import write_audio

    assert [audio_tokens(n) for n in range(1, 4001)] == _get_feat_extract_output_lengths(torch.arange(1, 4001)).tolist()
    tokenizer, features = parts
    write_audio(tmp_path / "long.wav", tone(31.0), 16000)
    sample = Sample("x.json", 0, [Turn("user", "<audio>?"), Turn("assistant", "ok")], {"audios": [tmp_path / "long.wav"]})
    encoded = Encoder(tokenizer, features, Qwen3OmniData()).encode(sample)
    assert encoded.tensors["audio_feature_lengths"].tolist() == [3100]
    assert encoded.input_ids.count(tokenizer.convert_tokens_to_ids("<|audio_pad|>")) == audio_tokens(3100) == 403


def test_mixed_conversations_preprocess_train_packed_and_export(omni, wild: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The wild file as it is, packed rows across modalities, a video at 4 fps (half a second
    per temporal patch: fractional M-RoPE times), the export reloaded with identical logits."""
    from mmcore.data import ShardDataset

    omni(
        "run",
        "--pack",
        "qwen3omni",
        "--preset",
        "tiny",
        "--data",
        str(wild),
        "--run-dir",
        "r",
        "training.steps=2",
        "training.micro_batch_size=2",
        "training.packing=true",
        "data.video_fps=4",
        "evaluate.enabled=false",
    )
    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    assert len(data) == 4
    first = data[0]
    assert first["image_grid_thw"].shape == (1, 3) and first["video_grid_thw"].shape == (1, 3)
    assert first["video_second_per_grid"].tolist() == [0.5]
    assert first["audio_feature_lengths"].tolist() == [70, 130]  # 0.7 s and 1.3 s at 100 frames/s
    assert data[1]["audio_feature_lengths"].tolist() == [40]
    assert "input_features" not in data[3] and "pixel_values" not in data[3]
    assert json.loads((tmp_path / "r/export/manifest.json").read_text())["metrics"]["logits_max_abs_diff"] == 0.0
