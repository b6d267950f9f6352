"""The demo's data: spoken digits, synthesised offline (numpy, seeded: the same files every run).

Each digit is a "syllable": a short chord at a pitch of its own (0.4 of an octave apart), with
a smooth envelope, random loudness and slight detuning, over faint noise. A clip holds one to
four of them at a nearly regular pace and its transcript names them ("seven one zero"). With
the earlier random pauses and two to five digits, whether the tiny model found the alignment
within the demo's steps depended on the seed (tools/demo_matrix.py). Written as real 16-bit
wav files plus transcript JSONL, so the demo takes exactly the path a user's dataset takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
RATE = 16000


def syllable(digit: int, rng: "np.random.Generator") -> "np.ndarray":
    import numpy as np

    n = int(RATE * rng.uniform(0.10, 0.14))
    pitch = 180 * 2 ** (digit / 2.5) * rng.uniform(0.98, 1.02)
    t = np.arange(n) / RATE
    envelope = np.sin(np.pi * np.arange(n) / n)
    return envelope * (np.sin(2 * np.pi * pitch * t) + 0.5 * np.sin(4 * np.pi * pitch * t)) / 1.5


def clip(digits: list[int], rng: "np.random.Generator") -> "np.ndarray":
    import numpy as np

    parts = [np.zeros(int(RATE * rng.uniform(0.02, 0.05)))]
    for digit in digits:
        parts += [syllable(digit, rng), np.zeros(int(RATE * rng.uniform(0.04, 0.06)))]
    samples = np.concatenate(parts)
    return rng.uniform(0.3, 0.9) * samples + rng.normal(0, 0.01, len(samples))


def write_demo_dataset(folder: Path, samples: int, seed: int, eval_fraction: float = 0.1) -> tuple[Path, Path]:
    """Write ``train.jsonl``, ``eval.jsonl`` and their wav files under ``folder``; return both files."""
    import numpy as np

    from mmcore.data import write_audio

    rng = np.random.default_rng(seed)
    records = []
    for i in range(samples):
        digits = [int(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 5)))]
        name = f"clips/{i:05d}.wav"
        write_audio(folder / name, clip(digits, rng), RATE)
        records.append({"audio": name, "text": " ".join(WORDS[d] for d in digits), "language": "en"})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records[:cut]))
    held_out.write_text("".join(json.dumps(r) + "\n" for r in records[cut:]))
    return train, held_out
