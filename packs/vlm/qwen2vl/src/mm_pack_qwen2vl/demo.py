"""The demo's data: coloured shapes on a white background, "What colour is the <shape>?".

Generated on the fly as real PNG files plus MLLM JSON (train and held-out eval files), so the
demo exercises exactly the path a user's dataset takes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mmcore.data.synthetic import COLOURS, SHAPES, shape_image


def write_demo_dataset(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    """Write ``train.json``, ``eval.json`` and their images under ``folder``; return both files."""
    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        name = f"images/{i:05d}.png"
        shape_image(shape, COLOURS[colour], rng).save(folder / name)
        records.append({"messages": [{"role": "user", "content": f"<image>What colour is the {shape}?"}, {"role": "assistant", "content": colour}], "images": [name]})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out
