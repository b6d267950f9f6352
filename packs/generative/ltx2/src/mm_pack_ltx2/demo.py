"""The ltx2 demo's synthetic clips with sound: the video demos' moving shapes ("a green circle
moves up", 24 captions), each with a tone whose pitch its colour decides (red 220 Hz, green
440 Hz, blue 880 Hz), muxed into the mp4 as an AAC sound track: a denoiser must read the
caption to get both the picture and the pitch right."""

from __future__ import annotations

import json
import random
from pathlib import Path

from mmcore.data import MOVES, MOVING_SHAPES, SHAPE_COLOURS, moving_shape, write_mp4

#: the tone each colour sounds
PITCH = {"red": 220.0, "green": 440.0, "blue": 880.0}
RATE, FPS = 16000, 8


def tone(hz: float, seconds: float, rng: random.Random):  # type: ignore[no-untyped-def]
    """A sine at ``hz`` (±2 %) over the clip, random loudness, 20 ms fades: float32 at :data:`RATE`."""
    import numpy as np

    t = np.arange(round(seconds * RATE)) / RATE
    fade = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.02)
    return (rng.uniform(0.4, 0.8) * fade * np.sin(2 * np.pi * hz * rng.uniform(0.98, 1.02) * t)).astype(np.float32)


def write_shapes_with_tones(folder: Path, samples: int, seed: int, size: int = 32, frames: int = 9) -> Path:
    """``samples`` captioned mp4 clips with sound and their caption JSON (MindSpeed-MM's format)."""
    rng = random.Random(seed)
    records = []
    for i in range(samples):
        colour, shape, move = rng.choice(sorted(SHAPE_COLOURS)), rng.choice(MOVING_SHAPES), rng.choice(sorted(MOVES))
        name = f"videos/{i:05d}.mp4"
        video = moving_shape(shape, SHAPE_COLOURS[colour], MOVES[move], rng, size=size, frames=frames)
        write_mp4(folder / name, video, FPS, audio=(tone(PITCH[colour], frames / FPS, rng), RATE))
        records.append({"path": name, "cap": f"a {colour} {shape} moves {move}", "num_frames": frames, "fps": FPS, "resolution": {"height": size, "width": size}})
    out = folder / "train.json"
    out.write_text(json.dumps(records, indent=1))
    return out
