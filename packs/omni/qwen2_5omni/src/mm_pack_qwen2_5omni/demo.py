"""The demo's data: a coloured shape and a tone per question; the answer needs both.

"What colour is the shape, and is the tone low, middle or high?" -> "blue high". The image is
a square, circle or triangle in one of four colours on white; the tone is a half-second sine
at one of three pitches (an octave apart) with random loudness and faint noise. Written as real
PNG and wav files plus MLLM JSON, so the demo takes exactly the path a user's dataset takes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mmcore.data.synthetic import COLOURS, SHAPES, shape_image

PITCHES = {"low": 220.0, "middle": 440.0, "high": 880.0}
QUESTION = "<image><audio>What colour is the shape, and is the tone low, middle or high?"
RATE = 16000


def tone(hz: float, rng):  # type: ignore[no-untyped-def]
    import numpy as np

    n = int(RATE * rng.uniform(0.4, 0.6))
    t = np.arange(n) / RATE
    envelope = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.02)  # 20 ms fade in and out
    return rng.uniform(0.3, 0.9) * envelope * np.sin(2 * np.pi * hz * rng.uniform(0.98, 1.02) * t) + rng.normal(0, 0.01, n)


def write_demo_dataset(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """Write ``train.json``, ``eval.json``, their images and clips under ``folder``; return both files."""
    import numpy as np

    from mmcore.data.audio import write_audio

    rng, pictures = np.random.default_rng(seed), random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        colour = sorted(COLOURS)[int(rng.integers(0, len(COLOURS)))]
        pitch = list(PITCHES)[int(rng.integers(0, len(PITCHES)))]
        image, clip = f"images/{i:05d}.png", f"clips/{i:05d}.wav"
        shape_image(pictures.choice(SHAPES), COLOURS[colour], pictures).save(folder / image)
        write_audio(folder / clip, tone(PITCHES[pitch], rng), RATE)
        records.append({"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": f"{colour} {pitch}"}], "images": [image], "audios": [clip]})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out
