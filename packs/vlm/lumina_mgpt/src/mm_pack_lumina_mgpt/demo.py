"""The demo's data and its measure: text -> picture of a coloured shape.

**Data** (LLaMA-Factory JSON): "a red square" -> the picture, as the assistant's ``<image>``; 4
colours x 3 shapes, each drawn at a random size and place on white (``mmcore.data.shape_image``),
32 pixels square (the tiny VQ encoder's 4 x 4 codes).

**Measure.** transformers' Chameleon has no VQ decoder (Lumina-mGPT decodes with Meta's original
VQGAN checkpoint), so a drawn picture's colour is read from its codes: each code is given the
colour of the training pictures it occurs in, where at least 90 % of its occurrences are in
pictures of one colour (codes of the white ground occur in all, and get none); a drawn
picture's colour is the most frequent colour among its codes. ``colour_agreement`` is the share
of held-out captions whose drawn picture has the caption's colour (chance: 25 %).
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def write_caption_pictures(folder: Path, samples: int, seed: int, eval_fraction: float = 0.2) -> tuple[Path, Path]:
    from mmcore.data import COLOURS, SHAPES, shape_image

    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(samples):
        shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        name = f"images/{i:05d}.png"
        shape_image(shape, COLOURS[colour], rng, size=32, radius=(9, 13)).save(folder / name)
        records.append({"messages": [{"role": "user", "content": f"a {colour} {shape}"}, {"role": "assistant", "content": "<image>"}], "images": [name]})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.json", folder / "eval.json"
    train.write_text(json.dumps(records[:cut], indent=1))
    held_out.write_text(json.dumps(records[cut:], indent=1))
    return train, held_out


def colour_of(text: str) -> str | None:
    from mmcore.data import COLOURS

    words = text.replace(".", " ").split()
    return next((w for w in words if w in COLOURS), None)


def code_colours(samples: Any, tokenizer: Any, codes: set[int], purity: float = 0.9) -> dict[int, str]:
    """Each image code's colour: that of the pictures it occurs in, where ``purity`` of its occurrences agree."""
    seen: dict[int, Counter[str]] = defaultdict(Counter)
    for i in range(len(samples)):
        sample = samples[i]
        labels = sample["labels"].tolist()
        drawn = set(labels) & codes
        if not drawn:
            continue
        start = next(j for j, t in enumerate(labels) if t != -100)
        colour = colour_of(tokenizer.decode(sample["input_ids"][:start].tolist()))
        for code in drawn if colour else ():
            seen[code][colour] += 1
    table = {}
    for code, counts in seen.items():
        colour, n = counts.most_common(1)[0]
        if n >= purity * sum(counts.values()):
            table[code] = colour
    return table


def drawn_colour(tokens: list[int], table: dict[int, str]) -> str | None:
    counts = Counter(table[t] for t in tokens if t in table)
    return counts.most_common(1)[0][0] if counts else None


def colour_agreement(prompts: list[str], drawn: list[list[int]], table: dict[int, str]) -> float | None:
    """The share of pictures in their caption's colour (None: no caption names a demo colour)."""
    pairs = [(colour_of(p), drawn_colour(d, table)) for p, d in zip(prompts, drawn)]
    pairs = [(want, got) for want, got in pairs if want]
    return sum(want == got for want, got in pairs) / len(pairs) if pairs else None
