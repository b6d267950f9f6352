"""The demo's data: "spoken" digits, synthesised offline (numpy, seeded), as LLaMA-Factory
audio conversations.

Each digit is a chord at a pitch of its own (0.4 of an octave apart) with a smooth envelope,
random loudness and slight detuning, over faint noise; a clip holds one to four of them at a
nearly regular pace. The sound is the whisper pack's demo's, spoken at about the pace of real
speech (``SYLLABLE``, ``GAP``; about 3 digits a second): Fun-ASR's front end gives one feature
row per 60 ms (LFR: 7 stacked 10 ms frames, stride 6), a third of Whisper's rate, so at
whisper's pace (0.10-0.14 s digits, 0.04-0.06 s pauses: ten a second) a digit was two rows and
the pause under one, and the tiny model's held-out WER depended on the seed (0.027-0.261 over 8
runs, tools/demo_matrix.py). Each sample is MLLM JSON as a
user writes it: ``{"messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant",
"content": "seven one zero"}], "audios": ["clips/00001.wav"]}``, with real 16-bit wav files, so
the demo takes exactly the path a user's dataset takes (the template makes the user turn
``语音转写：<audio>``, Fun-ASR's transcription request).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
RATE = 16000
SYLLABLE = (0.20, 0.26)  # seconds a digit lasts: 3-4 feature rows
GAP = (0.08, 0.12)  # seconds of pause after each: 1-2 rows


def syllable(digit: int, rng: Any) -> Any:
    import numpy as np

    n = int(RATE * rng.uniform(*SYLLABLE))
    pitch = 180 * 2 ** (digit / 2.5) * rng.uniform(0.98, 1.02)
    t = np.arange(n) / RATE
    envelope = np.sin(np.pi * np.arange(n) / n)
    return envelope * (np.sin(2 * np.pi * pitch * t) + 0.5 * np.sin(4 * np.pi * pitch * t)) / 1.5


def digits_clip(digits: list[int], rng: Any) -> Any:
    """16 kHz samples (numpy float64) of ``digits`` "spoken" one after another."""
    import numpy as np

    parts = [np.zeros(int(RATE * rng.uniform(0.02, 0.05)))]
    for digit in digits:
        parts += [syllable(digit, rng), np.zeros(int(RATE * rng.uniform(*GAP)))]
    samples = np.concatenate(parts)
    return rng.uniform(0.3, 0.9) * samples + rng.normal(0, 0.01, len(samples))


def write_spoken_digits(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """Write ``train.json``, ``eval.json`` and their wav files under ``folder``; return both files."""
    import numpy as np

    from mmcore.data import write_audio

    rng = np.random.default_rng(seed)
    records = []
    for i in range(samples):
        digits = [int(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 5)))]
        name = f"clips/{i:05d}.wav"
        write_audio(folder / name, digits_clip(digits, rng), RATE)
        answer = " ".join(WORDS[d] for d in digits)
        records.append({"messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant", "content": answer}], "audios": [name]})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out
