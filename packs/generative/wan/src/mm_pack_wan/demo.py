"""The demo's data: a coloured square moving left/right/up/down, captioned with which way.

Written as real H.264 mp4 files plus caption JSON, the layout MindSpeed-MM users already have.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "blue": (40, 60, 220)}
MOVES = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
SIZE, FRAMES, FPS = 32, 9, 8


def clip(colour: tuple[int, int, int], move: tuple[int, int], rng: random.Random):  # type: ignore[no-untyped-def]
    import numpy as np

    frames = np.full((FRAMES, SIZE, SIZE, 3), 255, dtype=np.uint8)
    side, speed = 8, 2
    x = rng.randint(side, SIZE - side) if move[0] == 0 else (SIZE - side - 2 if move[0] < 0 else 2)
    y = rng.randint(side, SIZE - side) if move[1] == 0 else (SIZE - side - 2 if move[1] < 0 else 2)
    for t in range(FRAMES):
        cx, cy = x + move[0] * speed * t, y + move[1] * speed * t
        frames[t, max(cy, 0) : cy + side, max(cx, 0) : cx + side] = colour
    return frames


def write_demo_dataset(folder: Path, samples: int, seed: int) -> Path:
    from mmcore.data.video import write_mp4

    rng = random.Random(seed)
    records = []
    for i in range(samples):
        colour, move = rng.choice(sorted(COLOURS)), rng.choice(sorted(MOVES))
        name = f"videos/{i:05d}.mp4"
        write_mp4(folder / name, clip(COLOURS[colour], MOVES[move], rng), FPS)
        records.append({"path": name, "cap": f"a {colour} square moves {move}", "num_frames": FRAMES, "fps": FPS, "resolution": {"height": SIZE, "width": SIZE}})
    out = folder / "train.json"
    out.write_text(json.dumps(records, indent=1))
    return out


def write_preference_dataset(folder: Path, samples: int, seed: int) -> Path:
    """The DPO demo's pairs: for "a square moves <way>", the clip with a red square is chosen
    and the same clip with a blue one rejected: the model comes to prefer red squares (a
    preference no caption states, as aesthetic preferences are)."""
    from mmcore.data.video import write_mp4

    rng = random.Random(seed)
    records = []
    for i in range(samples):
        move = rng.choice(sorted(MOVES))
        start = rng.getstate()
        chosen, rejected = f"videos/{i:05d}-red.mp4", f"videos/{i:05d}-blue.mp4"
        write_mp4(folder / chosen, clip(COLOURS["red"], MOVES[move], rng), FPS)
        rng.setstate(start)  # the same square in the same place: only the colour differs
        write_mp4(folder / rejected, clip(COLOURS["blue"], MOVES[move], rng), FPS)
        records.append({"cap": f"a square moves {move}", "chosen": chosen, "rejected": rejected})
    out = folder / "pairs.json"
    out.write_text(json.dumps(records, indent=1))
    return out
