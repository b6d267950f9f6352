"""Audio decoding and writing for every pack: any container FFmpeg reads, as mono float32.

PyAV (bundled FFmpeg) decodes wav, flac, mp3, ogg, opus, m4a and the audio track of a video, and
resamples to the rate a model wants in the same pass. Every failure is a :class:`MediaError`
naming the file, for the bad-sample policy.
"""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from mmcore.data.media import MediaError, check_seconds

if TYPE_CHECKING:
    from mmcore.data.badsamples import BadSample

__all__ = ["MediaError", "load_audio", "write_audio", "SpokenText", "read_spoken_texts"]

# The encoder (and its sample format) per suffix when writing.
_CODECS = {".flac": ("flac", "s16"), ".mp3": ("libmp3lame", "fltp"), ".m4a": ("aac", "fltp"), ".ogg": ("libopus", "flt"), ".opus": ("libopus", "flt")}


def load_audio(path: Path, sampling_rate: int = 16000) -> Any:
    """The first audio stream of ``path`` as a 1-D float32 numpy array at ``sampling_rate``, the
    channels averaged to mono."""
    pcm = _plain_wav(path, sampling_rate)
    return pcm if pcm is not None else ffmpeg_audio(path, sampling_rate)


def ffmpeg_audio(path: Path, sampling_rate: int) -> Any:
    """:func:`load_audio` through FFmpeg (PyAV), whatever the file."""
    import av
    import numpy as np

    chunks: list[Any] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError(f"{path} has no audio stream")
            stream = container.streams.audio[0]
            if container.duration:
                check_seconds(path, container.duration / 1e6, "audio")
            # Channels are kept through resampling and averaged here: FFmpeg's own downmix
            # scales each channel by 1/sqrt(2), which changes the level.
            resampler = av.AudioResampler(format="fltp", rate=sampling_rate)
            decoded = 0
            for frame in container.decode(stream):  # the header may lie or say nothing
                chunks += [out.to_ndarray().mean(axis=0) for out in resampler.resample(frame)]
                decoded += frame.samples
                if frame.sample_rate and decoded % (frame.sample_rate * 60) < frame.samples:
                    check_seconds(path, decoded / frame.sample_rate, "audio")
            chunks += [out.to_ndarray().mean(axis=0) for out in resampler.resample(None)]
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, IndexError) as exc:
        raise MediaError(f"unreadable audio {path}: {exc}") from None
    samples = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise MediaError(f"audio {path} decodes to no samples")
    if not np.isfinite(samples).all():
        raise MediaError(f"audio {path} decodes to NaN/inf samples")
    return samples


def _plain_wav(path: Path, sampling_rate: int) -> Any:
    """A 16-bit PCM ``.wav`` already at ``sampling_rate``, read with the standard library: the
    same float32 samples as FFmpeg's decode (``x / 32768``, exact, channels averaged alike),
    without loading PyAV and its FFmpeg libraries (~19 MiB of the process's memory, for the
    commonest speech file). None for any other file: FFmpeg decodes and resamples it."""
    if path.suffix.lower() != ".wav":
        return None
    import numpy as np

    try:
        with wave.open(str(path), "rb") as clip:
            if clip.getsampwidth() != 2 or clip.getframerate() != sampling_rate or clip.getcomptype() != "NONE":
                return None
            channels = clip.getnchannels()
            data = clip.readframes(clip.getnframes())  # what the file holds: a streamed wav's header may say more
    except (wave.Error, EOFError, OSError):
        return None  # not a plain PCM wav (WAVE_FORMAT_EXTENSIBLE, float, a bad header): FFmpeg reads it or says why
    usable = len(data) // (2 * channels) * channels
    if usable == 0:
        raise MediaError(f"audio {path} decodes to no samples")
    check_seconds(path, usable / channels / sampling_rate, "audio")
    samples = np.frombuffer(data, dtype="<i2", count=usable).reshape(-1, channels).T.astype(np.float32) / np.float32(32768)
    return samples.mean(axis=0).astype(np.float32, copy=False)


def write_audio(path: Path, samples: Any, sampling_rate: int) -> Path:
    """Write mono float samples in [-1, 1]: 16-bit PCM ``.wav`` (stdlib), or flac/mp3/m4a/ogg/opus (PyAV)."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    pcm = (np.clip(np.asarray(samples, dtype=np.float64), -1.0, 1.0) * 32767).round().astype("<i2")
    suffix = path.suffix.lower()
    if suffix == ".wav":
        with wave.open(str(path), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(sampling_rate)
            out.writeframes(pcm.tobytes())
        return path
    if suffix not in _CODECS:
        raise ValueError(f"{path}: cannot write {suffix or 'suffix-less'} audio (use one of .wav {' '.join(_CODECS)})")
    import av

    codec, sample_format = _CODECS[suffix]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=sampling_rate, layout="mono")
        data = pcm[None] if sample_format == "s16" else (pcm.astype(np.float32) / 32767)[None]
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=sample_format, layout="mono")
        frame.sample_rate = sampling_rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


@dataclass
class SpokenText:
    """One record of a speech dataset: its clip (resolved, inside the media root) and its text;
    ``record`` is the whole record, for a pack's own fields (speaker, speech tokens, ...)."""

    file: str
    index: int
    audio: Path
    text: str
    record: dict[str, Any]


def read_spoken_texts(path: Path, section: Any) -> Iterator["SpokenText | BadSample"]:
    """``{"audio": "a.wav" | {"path": "a.wav"}, "text": "..."}`` records of a JSON list or JSONL
    file, in order; a record without a clip path or with an empty text is a :class:`BadSample`
    naming the file and record (``section``: the data section, for the media root)."""
    from mmcore.data.badsamples import BadSample
    from mmcore.data.mllm import BadJSON, BadRecord, load_records, media_root, resolve_media

    root = media_root(path, section)
    for index, record in enumerate(load_records(path)):
        if isinstance(record, BadJSON) or not isinstance(record, dict):
            why = str(record) if isinstance(record, BadJSON) else f"expected an object, got {type(record).__name__}"
            yield BadSample(str(path), index, why)
            continue
        audio, text = record.get("audio"), record.get("text")
        audio = audio.get("path") if isinstance(audio, dict) else audio
        if not isinstance(audio, str) or not audio:
            yield BadSample(str(path), index, "no 'audio' path (or an object with a 'path')")
        elif not isinstance(text, str) or not text.strip():
            yield BadSample(str(path), index, "the 'text' is empty or not a string")
        else:
            try:
                yield SpokenText(str(path), index, resolve_media(audio, root, "audio"), text.strip(), record)
            except BadRecord as bad:  # a path that escapes the media root or names no file
                yield BadSample(str(path), index, str(bad))


def griffin_lim(magnitude: Any, n_fft: int, hop: int, win: int, iterations: int = 32, length: int | None = None) -> Any:
    """A waveform whose STFT magnitude is about ``magnitude`` (torch, bins x frames, ``n_fft // 2
    + 1`` bins, centred frames ``hop`` apart, Hann window of ``win``), by Griffin-Lim: from zero
    phase (deterministic), ``iterations`` rounds of keeping the magnitudes and taking the phase of
    the STFT of the inverse STFT. No learned weights: a speech demo voices its spectra with it
    where no trained vocoder is at hand. ``length`` samples (default frames x hop), float32,
    peak-normalised to 0.5.

    A clip whose last frame sounds is voiced with one silent frame after it, then cut to
    ``length``: otherwise the clip's last samples lie under the edge of one window only, which
    Griffin-Lim fills with a click louder than the clip (the peak normalisation then left the
    sound before it at 0.06-0.3 of its level, for every window tried)."""
    import torch

    magnitude = torch.as_tensor(magnitude).double().clamp(min=0)
    window = torch.hann_window(win, dtype=torch.float64)
    length = magnitude.shape[1] * hop if length is None else length
    voiced = length
    if bool(magnitude[:, -1].any()):
        magnitude = torch.cat([magnitude, magnitude.new_zeros(magnitude.shape[0], 1)], dim=1)
        voiced = max(length, magnitude.shape[1] * hop)

    def inverse(spec: Any) -> Any:
        return torch.istft(spec, n_fft, hop, win, window=window, center=True, length=voiced)

    spec = magnitude.to(torch.complex128)
    for _ in range(iterations):
        again = torch.stft(inverse(spec), n_fft, hop, win, window=window, center=True, return_complex=True)[:, : magnitude.shape[1]]
        spec = magnitude * again / again.abs().clamp(min=1e-8)
    wav = inverse(spec)[:length]
    return (wav / wav.abs().max().clamp(min=1e-8) * 0.5).float()
