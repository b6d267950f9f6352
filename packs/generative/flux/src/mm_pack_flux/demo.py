"""The demo's data: one coloured shape on white per image, captioned with its colour and shape
("a red circle"), written as real PNG files plus caption JSON (the layout MindSpeed-MM and the
common trainers use)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from mmcore.data import COLOURS, SHAPES, shape_image

SIZE = 64


def demo_images(count: int, seed: int) -> list:  # type: ignore[type-arg]
    """``count`` pictures as :func:`write_demo_dataset` draws them, uint8 [1, H, W, 3] each (no
    files): what the demo VAE learns to reconstruct."""
    import numpy as np

    rng = random.Random(seed)
    pictures = []
    for _ in range(count):
        colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
        pictures.append(np.asarray(shape_image(shape, COLOURS[colour], rng, size=SIZE, radius=(16, 26)))[None])
    return pictures


def write_demo_dataset(folder: Path, samples: int, seed: int) -> Path:
    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
        name = f"images/{i:05d}.png"
        shape_image(shape, COLOURS[colour], rng, size=SIZE, radius=(16, 26)).save(folder / name)
        records.append({"path": name, "cap": f"a {colour} {shape}", "resolution": {"height": SIZE, "width": SIZE}})
    out = folder / "train.json"
    out.write_text(json.dumps(records, indent=1))
    return out
