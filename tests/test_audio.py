"""Audio decoding: real containers and codecs, resampling, mixing to mono, clear errors."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from mmcore.data.audio import MediaError, ffmpeg_audio, load_audio, write_audio
from mmcore.testing import media


def tone(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    return media.tone(seconds, hz, rate, amplitude=0.5)


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.argmax(spectrum) * rate / len(samples))


@pytest.mark.parametrize("suffix,rate", [(".wav", 22050), (".flac", 22050), (".mp3", 22050), (".m4a", 22050), (".ogg", 48000)])
def test_codecs_decode_resampled_to_16k(tmp_path: Path, suffix: str, rate: int) -> None:
    path = write_audio(tmp_path / f"a{suffix}", tone(1.0, rate), rate)
    samples = load_audio(path, 16000)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - 16000) < 1200  # lossy codecs add priming/padding
    assert dominant_hz(samples, 16000) == pytest.approx(440, abs=2)


def test_stereo_44k_wav_is_mixed_to_mono(tmp_path: Path) -> None:
    left, right = tone(0.5, 44100, 440), tone(0.5, 44100, 440)
    pcm = (np.stack([left, right], axis=1) * 32767).astype("<i2")
    with wave.open(str(tmp_path / "s.wav"), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(44100)
        out.writeframes(pcm.tobytes())
    samples = load_audio(tmp_path / "s.wav", 16000)
    assert len(samples) == pytest.approx(8000, abs=64)
    assert np.abs(samples).max() == pytest.approx(0.5, abs=0.02)


def test_24_bit_8_khz_wav_is_upsampled(tmp_path: Path) -> None:
    pcm = (tone(0.5, 8000) * (2**23 - 1)).astype("<i4")
    packed = b"".join(int(v).to_bytes(4, "little", signed=True)[:3] for v in pcm)
    with wave.open(str(tmp_path / "p.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(3)
        out.setframerate(8000)
        out.writeframes(packed)
    samples = load_audio(tmp_path / "p.wav", 16000)
    assert len(samples) == pytest.approx(8000, abs=64)
    assert dominant_hz(samples, 16000) == pytest.approx(440, abs=2)
    assert np.abs(samples).max() == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize("channels", [1, 2])
def test_a_plain_wav_at_the_models_rate_reads_as_ffmpeg_decodes_it_without_loading_ffmpeg(tmp_path: Path, channels: int) -> None:
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    pcm = rng.integers(-32768, 32768, size=(16000, channels)).astype("<i2")
    pcm[:2] = [[-32768] * channels, [32767] * channels]  # the ends of the range
    with wave.open(str(tmp_path / "p.wav"), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm.tobytes())
    read, decoded = load_audio(tmp_path / "p.wav", 16000), ffmpeg_audio(tmp_path / "p.wav", 16000)
    assert read.dtype == decoded.dtype == np.float32 and read.tobytes() == decoded.tobytes()  # the same bits
    # FFmpeg's libraries (PyAV) stay out of a process that reads only such files: ~19 MiB of its memory
    code = f"import sys; from pathlib import Path; from mmcore.data.audio import load_audio; load_audio(Path({str(tmp_path / 'p.wav')!r}), 16000); print('av' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_a_streamed_wav_whose_header_claims_more_than_it_holds_reads_what_it_holds(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "s.wav", tone(1.0, 16000), 16000)
    whole = load_audio(path, 16000)
    raw = bytearray(path.read_bytes())
    at = raw.index(b"data") + 4
    raw[at : at + 4] = (0xFFFFFFF0).to_bytes(4, "little")  # a live stream's writer did not know the length (about 37 h)
    path.write_bytes(bytes(raw))
    assert load_audio(path, 16000).tobytes() == whole.tobytes()


def test_unreadable_audio_is_a_media_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    with pytest.raises(MediaError, match="broken.wav"):
        load_audio(tmp_path / "broken.wav")
    full = write_audio(tmp_path / "cut.mp3", tone(1.0, 16000), 16000).read_bytes()
    (tmp_path / "cut.mp3").write_bytes(full[:40])
    with pytest.raises(MediaError, match="cut.mp3"):
        load_audio(tmp_path / "cut.mp3")


def test_speech_records_are_read_and_bad_ones_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``read_spoken_texts``: each bad record is one BadSample naming its file and index, in order."""
    from mmcore.config import DataSection
    from mmcore.data import BadSample, SpokenText, read_spoken_texts

    (tmp_path / "a.wav").write_bytes(b"RIFF")
    lines = [
        '{"audio": "a.wav", "text": " seven one "}',
        '{"audio": {"path": "a.wav"}, "text": "two", "speaker": "x"}',
        "[1, 2]",
        '{"text": "no clip"}',
        '{"audio": "a.wav", "text": "  "}',
        '{"audio": "../a.wav", "text": "out"}',
        '{"audio": "gone.wav", "text": "gone"}',
        "{not json",
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(lines) + "\n")
    got = list(read_spoken_texts(data, DataSection()))
    assert [type(x).__name__ for x in got] == ["SpokenText", "SpokenText"] + ["BadSample"] * 6
    first, second = got[0], got[1]
    assert isinstance(first, SpokenText) and first.text == "seven one" and first.audio == (tmp_path / "a.wav").resolve()
    assert isinstance(second, SpokenText) and second.record["speaker"] == "x"
    reasons = [x.reason for x in got[2:] if isinstance(x, BadSample)]
    assert [x.index for x in got[2:]] == [2, 3, 4, 5, 6, 7]
    assert "expected an object" in reasons[0] and "no 'audio' path" in reasons[1] and "'text' is empty" in reasons[2]
    assert "escapes the dataset folder" in reasons[3] and "not found" in reasons[4]
