"""Spoken digits, synthesised offline (numpy, seeded), and a fixed checker that hears them.

Each digit is a "syllable": a chord (a fundamental and half as loud its octave) at a pitch of its
own, ``180 * 2 ** (digit / 2.5)`` Hz (0.4 of an octave apart: 180 Hz to 2.18 kHz), with a sine
envelope, slight detuning, random loudness and faint noise. A clip holds one to four digits at a
nearly regular pace and its transcript names them ("seven one zero"). The speech demos (whisper,
funasr, cosyvoice3) share this data; ``DIGIT_PACES`` names the two paces they use.

The checker is fixed (no learning): it segments a waveform by frame energy, estimates each
segment's fundamental from its spectrum, and names the digit whose pitch is nearest on a log
scale. A speech generation demo transcribes its generated wavs with it, so its promise (a word
error rate) does not depend on a model trained alongside.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_RATE = 16000
#: name -> (seconds a digit lasts, seconds of pause after it): "fast" is about ten digits a second
#: (whisper's demo), "speech" about three (the pace of real speech; funasr's and cosyvoice3's)
DIGIT_PACES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "fast": ((0.10, 0.14), (0.04, 0.06)),
    "speech": ((0.20, 0.26), (0.08, 0.12)),
}


def digit_pitch(digit: int) -> float:
    """The fundamental (Hz) a digit is spoken at."""
    return 180 * 2 ** (digit / 2.5)


def syllable(digit: int, rng: Any, pace: str = "fast", rate: int = DIGIT_RATE) -> Any:
    """One digit's samples (numpy float64), peak about 1."""
    import numpy as np

    n = int(rate * rng.uniform(*DIGIT_PACES[pace][0]))
    pitch = digit_pitch(digit) * rng.uniform(0.98, 1.02)
    t = np.arange(n) / rate
    envelope = np.sin(np.pi * np.arange(n) / n)
    return envelope * (np.sin(2 * np.pi * pitch * t) + 0.5 * np.sin(4 * np.pi * pitch * t)) / 1.5


def digits_clip(digits: Iterable[int], rng: Any, pace: str = "fast", rate: int = DIGIT_RATE) -> Any:
    """Samples (numpy float64) of ``digits`` "spoken" one after another at ``pace``."""
    import numpy as np

    parts = [np.zeros(int(rate * rng.uniform(0.02, 0.05)))]
    for digit in digits:
        parts += [syllable(digit, rng, pace, rate), np.zeros(int(rate * rng.uniform(*DIGIT_PACES[pace][1])))]
    samples = np.concatenate(parts)
    return rng.uniform(0.3, 0.9) * samples + rng.normal(0, 0.01, len(samples))


def text_of(digits: Iterable[int]) -> str:
    return " ".join(DIGIT_WORDS[d] for d in digits)


def write_spoken_digit_clips(folder: Path, samples: int, seed: int, pace: str = "fast", rate: int = DIGIT_RATE) -> list[tuple[str, str]]:
    """Write ``clips/00000.wav``... under ``folder`` (one to four random digits each); return
    ``(relative wav path, transcript)`` per clip, in order (the demos split and format them)."""
    import numpy as np

    from mmcore.data.audio import write_audio

    rng = np.random.default_rng(seed)
    out = []
    for i in range(samples):
        digits = [int(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 5)))]
        name = f"clips/{i:05d}.wav"
        write_audio(Path(folder) / name, digits_clip(digits, rng, pace, rate), rate)
        out.append((name, text_of(digits)))
    return out


def _segments(samples: Any, rate: int, frame_s: float = 0.01, threshold: float = 0.2, min_s: float = 0.03) -> list[tuple[int, int]]:
    """``(start, end)`` sample spans whose 10 ms frame RMS exceeds ``threshold`` of the loudest
    frame's; spans shorter than ``min_s`` are dropped."""
    import numpy as np

    hop = max(1, int(rate * frame_s))
    frames = len(samples) // hop
    if frames == 0:
        return []
    rms = np.sqrt((samples[: frames * hop].reshape(frames, hop) ** 2).mean(axis=1))
    if rms.max() <= 1e-4:
        return []
    loud = np.concatenate([[False], rms > threshold * rms.max(), [False]])
    edges = np.flatnonzero(np.diff(loud.astype(np.int8)))
    spans = [(int(a) * hop, int(b) * hop) for a, b in zip(edges[::2], edges[1::2])]
    return [(a, b) for a, b in spans if b - a >= min_s * rate]


def segment_pitch(segment: Any, rate: int) -> float:
    """The fundamental (Hz) of one syllable: the spectrum's strongest peak between 120 Hz and
    3 kHz, moved down an octave when the half frequency holds a comparable peak (the octave is the
    chord's second tone)."""
    import numpy as np

    n = 1 << int(np.ceil(np.log2(max(len(segment), 2) * 4)))
    spectrum = np.abs(np.fft.rfft(segment * np.hanning(len(segment)), n))
    freqs = np.fft.rfftfreq(n, 1 / rate)
    band = (freqs >= 120) & (freqs <= 3000)
    peak = float(freqs[band][np.argmax(spectrum[band])])
    near_half = (freqs >= peak / 2 * 0.94) & (freqs <= peak / 2 * 1.06)
    if peak / 2 >= 120 and near_half.any() and spectrum[near_half].max() >= 0.3 * spectrum[band].max():
        peak = float(freqs[near_half][np.argmax(spectrum[near_half])])
    return peak


def pitch_segments(samples: Any, rate: int) -> list[tuple[int, int, float]]:
    """``(start, end, pitch in Hz)`` of each syllable the checker hears (sample indices)."""
    import numpy as np

    samples = np.asarray(samples, dtype=np.float64).reshape(-1)
    return [(a, b, segment_pitch(samples[a:b], rate)) for a, b in _segments(samples, rate)]


def transcribe_digits(samples: Any, rate: int) -> str:
    """The digit words a spoken-digit waveform says, by pitch (the fixed checker)."""
    import numpy as np

    pitches = np.log2([digit_pitch(d) for d in range(10)])
    return " ".join(DIGIT_WORDS[int(np.argmin(np.abs(pitches - np.log2(f0))))] for _, _, f0 in pitch_segments(samples, rate))


def digits_wer(references: Iterable[str], hypotheses: Iterable[str]) -> float:
    """Corpus word error rate: word edits over reference words (``mmcore.engines.word_errors``)."""
    from mmcore.engines.evaluation import word_errors

    counts = [word_errors(r, h) for r, h in zip(references, hypotheses, strict=True)]
    return sum(e for e, _ in counts) / max(sum(n for _, n in counts), 1)
