"""Preprocessing: parity with transformers' Omni processor, mixed-modality conversations, bad media."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.testing.media import tone
from mm_pack_qwen2_5omni.config import OmniData
from mm_pack_qwen2_5omni.data import Encoder
from mmcore.data import Sample, Turn


@pytest.fixture(scope="module")
def parts(tiny_omni: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    return AutoTokenizer.from_pretrained(tiny_omni), WhisperFeatureExtractor.from_pretrained(tiny_omni)


def test_encoding_equals_the_omni_processor_and_chat_template(parts, tiny_omni: Path, wild_omni: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    from mm_pack_qwen2_5omni.processor import OmniProcessorWithoutVideo
    from mmcore.data import load_audio
    from mm_qwen_vision import image_processor

    tokenizer, features = parts
    cfg = OmniData(image_max_pixels=3136)
    sample = Sample("x.json", 0, [Turn("user", "<image><audio>What do you see and hear?"), Turn("assistant", "red")], {"images": [wild_omni / "imgs/a.jpg"], "audios": [wild_omni / "sounds/b.mp3"]})
    encoded = Encoder(tokenizer, features, cfg).encode(sample)

    processor = OmniProcessorWithoutVideo.from_pretrained(tiny_omni)  # what init:tiny saved
    processor.image_processor = image_processor(cfg.image_min_pixels, cfg.image_max_pixels)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "What do you see and hear?"}]}, {"role": "assistant", "content": "red"}]
    text = processor.apply_chat_template(messages, tokenize=False)
    want = processor(text=[text], images=[Image.open(wild_omni / "imgs/a.jpg").convert("RGB")], audio=[load_audio(wild_omni / "sounds/b.mp3")], return_tensors="np")
    assert encoded.input_ids == want["input_ids"][0].tolist()
    assert np.array_equal(encoded.tensors["pixel_values"].numpy(), want["pixel_values"])
    frames = int(want["feature_attention_mask"][0].sum())
    assert encoded.tensors["audio_feature_lengths"].tolist() == [frames]
    assert np.array_equal(encoded.tensors["input_features"].numpy(), want["input_features"][0][:, :frames].T)


def test_mixed_conversations_preprocess_without_edits(omni, wild_omni: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import ShardDataset

    omni("run", "--pack", "qwen2.5omni", "--preset", "tiny", "--data", str(wild_omni / "data.json"), "--run-dir", "r", "training.steps=1", "training.micro_batch_size=1", "training.packing=true")
    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    assert len(data) == 4
    first = data[0]
    assert first["image_grid_thw"].shape == (1, 3) and first["video_grid_thw"].shape == (1, 3)
    assert first["audio_feature_lengths"].tolist() == [70, 130]  # 0.7 s and 1.3 s at 100 frames/s
    assert data[1]["audio_feature_lengths"].tolist() == [40]
    assert "input_features" not in data[3] and "pixel_values" not in data[3]
    assert json.loads((tmp_path / "r/export/manifest.json").read_text())["metrics"]["logits_max_abs_diff"] == 0.0


def test_bad_media_is_counted_and_named_when_skipping(omni, wild_omni: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import write_audio

    write_audio(wild_omni / "sounds/long.wav", tone(31.0), 16000)
    (wild_omni / "sounds/broken.mp3").write_bytes(b"ID3\x03\x00 not mp3")
    good = {"messages": [{"role": "user", "content": "<audio>?"}, {"role": "assistant", "content": "ok"}], "audios": ["sounds/a.wav"]}
    bad = [
        {"messages": [{"role": "user", "content": "<audio>?"}, {"role": "assistant", "content": "x"}], "audios": ["sounds/broken.mp3"]},
        {"messages": [{"role": "user", "content": "<audio>?"}, {"role": "assistant", "content": "x"}], "audios": ["sounds/long.wav"]},
        {"messages": [{"role": "user", "content": "<audio><audio>?"}, {"role": "assistant", "content": "x"}], "audios": ["sounds/a.wav"]},
        {"messages": [{"role": "user", "content": "<audio>?"}, {"role": "assistant", "content": "x"}], "audios": ["sounds/missing.wav"]},
    ]
    (wild_omni / "bad.json").write_text(json.dumps([good, *bad]))
    omni("download", "--pack", "qwen2.5omni", "--preset", "tiny", "--run-dir", "r")
    omni("convert", "--pack", "qwen2.5omni", "--preset", "tiny", "--run-dir", "r")
    proc = omni(
        "preprocess", "--pack", "qwen2.5omni", "--preset", "tiny", "--run-dir", "r", "--data", str(wild_omni / "bad.json"), "data.on_bad_sample=skip", "training.micro_batch_size=1"
    )  # one sample is good
    assert "skipped 4 bad sample(s)" in proc.stdout
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "r/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert "unreadable audio" in reasons[0] and "broken.mp3" in reasons[0]
    assert "31.0 s, longer than the 30 s the audio tower takes" in reasons[1]
    assert "2 <audio> placeholder(s) but 1 audios" in reasons[2]
    assert "audio file not found" in reasons[3]
