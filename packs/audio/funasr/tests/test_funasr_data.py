"""Preprocessing: parity with transformers' Fun-ASR-Nano processor and chat template, the Kaldi
front end, long audio as the processor takes it, LLaMA-Factory audio data as found in the wild."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.data import MediaError, Sample, Turn
from mmcore.testing.media import tone
from mm_pack_funasr.config import FunAsrData
from mm_pack_funasr.data import CHAT_TEMPLATE, Encoder
from mm_pack_funasr.demo import digits_clip
from mm_pack_funasr.family import feature_settings

MAX_ROWS = 2048  # the tiny tower's positions, as the released model's (max_position_embeddings 2049)


@pytest.fixture(scope="module")
def parts(tiny_funasr: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer, FunAsrNanoProcessor

    from mm_pack_funasr.features import family_feature_extractor

    tokenizer = AutoTokenizer.from_pretrained(tiny_funasr)
    processor = FunAsrNanoProcessor(family_feature_extractor(), tokenizer, chat_template=CHAT_TEMPLATE)
    return tokenizer, processor, Encoder(tokenizer, feature_settings(tiny_funasr), FunAsrData(), max_rows=MAX_ROWS)


def clip_file(path: Path, samples: np.ndarray, rate: int = 16000) -> Path:
    from mmcore.data import write_audio

    write_audio(path, samples, rate)
    return path


def test_encoding_equals_the_family_processor_and_chat_template(parts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.data import load_audio

    tokenizer, processor, encoder = parts
    wav = clip_file(tmp_path / "a.wav", digits_clip([7, 1, 0], np.random.default_rng(0)))
    sample = Sample("x.json", 0, [Turn("user", "<audio>"), Turn("assistant", "seven one zero")], {"audios": [wav]})
    encoded = encoder.encode(sample)
    audio = load_audio(wav)
    messages = [{"role": "user", "content": [{"type": "audio"}]}, {"role": "assistant", "content": "seven one zero"}]
    text = processor.apply_chat_template(messages, tokenize=False)
    assert "语音转写：<|object_ref_start|><|im_end|>" in text
    want = processor(text=[text], audio=[audio])
    assert encoded.input_ids == want["input_ids"][0].tolist()
    rows = int(want["input_features_mask"][0].sum())
    assert encoded.tensors["audio_feature_lengths"].tolist() == [rows] and encoded.input_ids.count(processor.audio_token_id) == rows
    assert np.array_equal(encoded.tensors["input_features"].numpy(), want["input_features"][0][:rows].numpy())
    # the answer is what is learnt, ending at <|im_end|>
    learnt = [t for t, label in zip(encoded.input_ids, encoded.labels) if label != -100]
    assert tokenizer.decode(learnt).strip() == "seven one zero<|im_end|>"
    # a prompt for generation is the family's transcription request
    request = processor.apply_transcription_request(audio, tokenize=False)[0]
    prompt = encoder.encode_prompt(Sample("x.json", 0, [Turn("user", "<audio>")], {"audios": [wav]}))
    assert prompt.input_ids == processor(text=[request], audio=[audio])["input_ids"][0].tolist()


def test_kaldi_fbank_equals_a_float64_reference() -> None:
    """The front end against Kaldi's definition written out frame by frame in float64."""
    from mm_pack_funasr.features import kaldi_fbank

    rng = np.random.default_rng(1)
    x = np.concatenate([tone(0.3, 300), 0.2 * rng.standard_normal(1234)])
    size, shift, nfft = 400, 160, 512
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    lo, hi = mel(20.0), mel(8000.0)
    edges = lo + np.arange(82) * (hi - lo) / 81
    fft_mel = mel(np.arange(256) * 16000 / nfft)
    banks = np.zeros((80, 257))
    for b in range(80):
        up = (fft_mel - edges[b]) / (edges[b + 1] - edges[b])
        down = (edges[b + 2] - fft_mel) / (edges[b + 2] - edges[b + 1])
        banks[b, :256] = np.maximum(0.0, np.minimum(up, down))
    window = 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(size) / (size - 1))
    want = []
    for i in range(1 + (len(x) - size) // shift):
        frame = x[i * shift : i * shift + size].copy()
        frame -= frame.mean()
        frame = frame - 0.97 * np.concatenate([frame[:1], frame[:-1]])
        power = np.abs(np.fft.rfft(frame * window, nfft)) ** 2
        want.append(np.log(np.maximum(banks @ power, np.finfo(np.float32).eps)))
    import torch

    got = kaldi_fbank(torch.tensor(x, dtype=torch.float32)).numpy()
    assert got.shape == (len(want), 80)
    assert np.abs(got - np.array(want)).max() < 2e-3


def test_long_audio_is_taken_whole_as_the_processor_does(parts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """No 30 s window: a 45 s recording is one clip of ceil(frames / 6) rows, as
    ``FunAsrNanoProcessor`` gives it; one past the tower's positions is a bad sample naming the limit."""
    import torch

    from mmcore.data import load_audio
    from mm_pack_funasr.family import FAMILY

    tokenizer, processor, encoder = parts
    long = clip_file(tmp_path / "long.wav", np.tile(digits_clip([3, 5], np.random.default_rng(2)), 200)[: 45 * 16000])
    sample = Sample("x.json", 0, [Turn("user", "<audio>"), Turn("assistant", "three five")], {"audios": [long]})
    encoded = encoder.encode(sample)
    want = processor(text=[processor.apply_chat_template([{"role": "user", "content": [{"type": "audio"}]}, {"role": "assistant", "content": "three five"}], tokenize=False)], audio=[load_audio(long)])
    rows = 1 + (45 * 16000 - 400) // 160
    assert encoded.tensors["audio_feature_lengths"].tolist() == [-(-rows // 6)] == [int(want["input_features_mask"].sum())]
    assert encoded.input_ids == want["input_ids"][0].tolist()
    # the tiny model reads all 750 rows
    model = FAMILY.build_model(Path(processor.tokenizer.name_or_path)).eval()
    stored = {"input_ids": torch.tensor(encoded.input_ids), "labels": torch.tensor(encoded.labels), **encoded.tensors}
    with torch.no_grad():
        assert torch.isfinite(FAMILY.loss_sum(model, FAMILY.collate([stored], FAMILY.token_ids_of(tokenizer))))
    too_long = clip_file(tmp_path / "too_long.wav", np.zeros(int(123.5 * 16000)) + 0.01)
    with pytest.raises(MediaError, match=r"123\.5 s, longer than the 122\.9 s the audio tower's positions cover"):
        encoder.encode(Sample("x.json", 0, [Turn("user", "<audio>"), Turn("assistant", "x")], {"audios": [too_long]}))


def test_a_batch_of_clips_pads_as_the_feature_extractor_does(parts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch

    from mm_pack_funasr.family import collate_lfr_clips

    _, processor, encoder = parts
    clips = [digits_clip([1], np.random.default_rng(3)), digits_clip([2, 4, 6, 8], np.random.default_rng(4))]
    samples = []
    for i, samples_ in enumerate(clips):
        piece = encoder.expanders["<audio>"](clip_file(tmp_path / f"{i}.wav", samples_))
        samples.append({"input_features": torch.from_numpy(piece.fields["input_features"]), "audio_feature_lengths": torch.tensor(piece.fields["audio_feature_lengths"])})
    batch: dict = {}
    collate_lfr_clips(batch, samples, {})
    from mmcore.data import load_audio

    want = processor.feature_extractor([load_audio(tmp_path / f"{i}.wav") for i in range(2)], sampling_rate=16000)
    assert torch.equal(batch["input_features"], want["input_features"])
    assert torch.equal(batch["input_features_mask"], want["input_features_mask"].long())


def test_llama_factory_audio_data_as_found_in_the_wild(funasr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """wav, mp3 (22.05 kHz) and flac (44.1 kHz) clips, multi-turn, a system prompt, text-only
    samples and a bad clip, unedited: preprocessed, trained, exported, evaluated with WER."""
    from mmcore.data import ShardDataset
    from mmcore.testing import stage_manifest

    root = tmp_path / "wild"
    clip_file(root / "sounds/a.wav", digits_clip([1, 2], np.random.default_rng(5)))
    clip_file(root / "sounds/b.mp3", tone(1.3, 660, 22050), 22050)
    clip_file(root / "sounds/c.flac", tone(0.4, 220, 44100), 44100)
    (root / "sounds/broken.mp3").write_bytes(b"ID3\x03\x00 not mp3")
    records = [
        {"messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant", "content": "one two"}], "audios": ["sounds/a.wav"]},
        {
            "messages": [
                {"role": "system", "content": "Transcribe."},
                {"role": "user", "content": "<audio>Meeting about tones."},
                {"role": "assistant", "content": "a tone"},
                {"role": "user", "content": "<audio>"},
                {"role": "assistant", "content": "a low tone"},
            ],
            "audios": ["sounds/b.mp3", "sounds/c.flac"],
        },
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant", "content": "x"}], "audios": ["sounds/broken.mp3"]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    funasr(
        "run",
        "--pack",
        "funasr",
        "--preset",
        "tiny",
        "--data",
        str(root / "data.json"),
        "--run-dir",
        "r",
        "data.on_bad_sample=skip",
        "training.steps=1",
        "evaluate.datasets=[" + str(root / "data.json") + "]",
    )
    data = ShardDataset(tmp_path / "r/preprocess/dataset")
    assert len(data) == 3
    assert data[1]["audio_feature_lengths"].tolist() == [22, 7]  # 1.3 s and 0.4 s: 128 and 38 frames, every 6th
    assert "input_features" not in data[2]
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "r/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert len(reasons) == 1 and "broken.mp3" in reasons[0]
    assert stage_manifest(tmp_path / "r", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    metrics = stage_manifest(tmp_path / "r", "evaluate")["metrics"]
    assert 0.0 <= metrics["cer"] and metrics["wer"] >= 0.0 and metrics["items"] == 3
