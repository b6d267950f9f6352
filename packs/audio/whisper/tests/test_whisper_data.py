"""Preprocessing audio datasets as found in the wild: formats, field names, bad clips."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest

from mmcore.data import write_audio
from mmcore.testing.media import tone

RATE = 16000


def write_stereo_wav(path: Path, seconds: float, rate: int = 44100) -> None:
    pcm = (np.stack([tone(seconds, 330, rate), tone(seconds, 550, rate)], axis=1) * 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())


@pytest.fixture
def whisper_cli(whisper_cli, converted: Path):  # type: ignore[no-untyped-def]
    whisper_cli.converted = converted
    return whisper_cli


@pytest.fixture
def wild_audio(tmp_path: Path) -> Path:
    """wav (44.1 kHz stereo), flac (22.05 kHz), mp3 and m4a clips, plus broken and too-long ones."""
    root = tmp_path / "wild"
    write_stereo_wav(root / "clips/a.wav", 1.2)
    write_audio(root / "clips/b.flac", tone(0.8, 330, 22050), 22050)
    write_audio(root / "clips/c.mp3", tone(1.0), RATE)
    write_audio(root / "clips/d.m4a", tone(0.6), RATE)
    write_audio(root / "clips/long.wav", tone(3.0), RATE)  # the tiny model's window is 2 s
    (root / "clips/broken.flac").write_bytes(b"fLaC\x00garbage")
    return root


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with download and convert done (copied per test: preprocess needs them)."""
    from mmcore.testing import StageCLI

    root = tmp_path_factory.mktemp("converted")
    for stage in ("download", "convert"):
        StageCLI(root)(stage, "--pack", "whisper", "--preset", "tiny", "--run-dir", "run")
    return root / "run"


def run_preprocess(whisper_cli, dataset: Path, *extra: str, check: bool = True):  # type: ignore[no-untyped-def]
    import shutil

    shutil.copytree(whisper_cli.converted, whisper_cli.cwd / "run")
    return whisper_cli("preprocess", "--pack", "whisper", "--preset", "tiny", "--data", str(dataset), "--run-dir", "run", *extra, check=check)


def test_transcript_json_with_every_codec_and_field_naming(whisper_cli, wild_audio: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import ShardDataset

    records = [
        {"audio": "clips/a.wav", "text": "one two", "language": "en"},
        {"audio_filepath": "clips/b.flac", "text": "three", "duration": 0.8},  # NeMo manifest
        {"path": "clips/c.mp3", "sentence": "four five", "locale": "en"},  # Common Voice
        {"audio": {"path": "clips/d.m4a"}, "transcription": "six", "language": "english"},  # datasets export
    ]
    (wild_audio / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run_preprocess(whisper_cli, wild_audio / "train.jsonl")
    data = ShardDataset(tmp_path / "run/preprocess/dataset")
    assert len(data) == 4
    from transformers import WhisperFeatureExtractor, WhisperTokenizer

    model = tmp_path / "run/download/model"
    tokenizer = WhisperTokenizer.from_pretrained(model)
    features = WhisperFeatureExtractor.from_pretrained(model)
    first = data[0]
    assert tuple(first["input_features"].shape) == (80, features.nb_max_frames)
    assert tokenizer.convert_ids_to_tokens(first["labels"][:4].tolist()) == ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    assert tokenizer.decode(first["labels"], skip_special_tokens=True) == "one two"
    assert [data.meta(i)["text"] for i in range(4)] == ["one two", "three", "four five", "six"]
    assert [data.meta(i)["prefix"] for i in range(4)] == [4, 4, 4, 4]
    # The features are exactly what the feature extractor makes of the decoded 16 kHz audio.
    from mmcore.data import load_audio

    want = features(load_audio(wild_audio / "clips/c.mp3", RATE), sampling_rate=RATE, return_tensors="np")["input_features"][0]
    assert np.array_equal(data[2]["input_features"].numpy(), want)


def test_language_per_sample_and_none(tiny_whisper: Path, wild_audio: Path) -> None:
    """A sample without a language after one with a language gets no language token."""
    from mm_pack_whisper.data import Encoder

    encoder = Encoder(tiny_whisper, "transcribe")
    tokens = encoder.tokenizer.convert_ids_to_tokens
    german = encoder.labels("eins", "german")
    plain = encoder.labels("one", None)
    assert tokens(german[:4]) == ["<|startoftranscript|>", "<|de|>", "<|transcribe|>", "<|notimestamps|>"]
    assert tokens(plain[:3]) == ["<|startoftranscript|>", "<|transcribe|>", "<|notimestamps|>"]
    assert (encoder.prefix_length(german), encoder.prefix_length(plain)) == (4, 3)


def test_mllm_json_with_audios(whisper_cli, wild_audio: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import ShardDataset

    records = [
        {"messages": [{"role": "user", "content": "<audio>Transcribe this."}, {"role": "assistant", "content": "one two"}], "audios": ["clips/a.wav"]},
        {"messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant", "content": "three"}], "audios": ["clips/b.flac"]},
    ]
    (wild_audio / "mllm.json").write_text(json.dumps(records))
    run_preprocess(whisper_cli, wild_audio / "mllm.json")
    data = ShardDataset(tmp_path / "run/preprocess/dataset")
    assert [data.meta(i)["text"] for i in range(len(data))] == ["one two", "three"]


def test_bad_clips_are_counted_and_named_when_skipping(whisper_cli, wild_audio: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    records = [
        {"audio": "clips/a.wav", "text": "fine"},
        {"audio": "clips/broken.flac", "text": "broken"},
        {"audio": "clips/long.wav", "text": "too long"},
        {"audio": "clips/missing.wav", "text": "missing"},
        {"audio": "clips/c.mp3", "text": "   "},
        {"audio": "clips/c.mp3", "text": "unknown language", "language": "klingon"},
        {"text": "no audio field"},
    ]
    (wild_audio / "data.json").write_text(json.dumps(records))
    proc = run_preprocess(whisper_cli, wild_audio / "data.json", "data.on_bad_sample=skip", "training.micro_batch_size=1")  # one clip is good
    assert "skipped 6 bad sample(s)" in proc.stdout
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "run/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert len(reasons) == 6
    assert any("unreadable audio" in r and "broken.flac" in r for r in reasons)
    assert any("3.0 s, longer than the model's 2 s window" in r for r in reasons)
    assert any("audio file not found" in r for r in reasons)
    assert any("transcript is empty" in r for r in reasons)
    assert any("'klingon' is not one Whisper knows" in r for r in reasons)
    assert any("no audio field" in r for r in reasons)


def test_a_bad_clip_stops_the_run_with_one_line_by_default(whisper_cli, wild_audio: Path) -> None:  # type: ignore[no-untyped-def]
    (wild_audio / "data.json").write_text(json.dumps([{"audio": "clips/broken.flac", "text": "x"}]))
    proc = run_preprocess(whisper_cli, wild_audio / "data.json", check=False)
    assert proc.returncode == 1
    assert "data.json" in proc.stderr and "broken.flac" in proc.stderr and "Traceback" not in proc.stderr
