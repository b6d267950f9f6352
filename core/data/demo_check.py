"""Does a generated picture or clip show what its demo caption says? The caption-agreement
checker of the synthetic demos (:mod:`mmcore.data.synthetic`): "a red circle" (FLUX's images)
and "a green square moves left" (the video demos).

What is drawn is read from the pixels alone: the coloured pixels (far from grey, so neither
the white ground nor the grey static of an untrained model counts), their mean colour (the
nearest demo colour), how much of their bounding box they fill (a square fills it, a circle
about 0.79 of it, a triangle half; judged in pictures, on shapes at least 16 px across:
the video demos' 12 px squares come out of a small VAE with round corners) and which way their centroid travels from the first frames to
the last. A caption of another form is no demo caption: the checker says None, so data that
is not the demo's reports no agreement rather than a wrong one.
"""

from __future__ import annotations

import re
from typing import Any

from mmcore.data.synthetic import COLOURS, MOVES, MOVING_SHAPES, SHAPES

DEMO_CAPTION = re.compile(r"^an? (?P<colour>[a-z]+) (?P<shape>[a-z]+)(?: moves (?P<move>[a-z]+))?$")
#: a pixel is the shape's when its channels differ by more than this (white and grey: 0)
SATURATION = 80
#: fill of its bounding box above which a shape is a square; below TRIANGLE_FILL, a triangle
SQUARE_FILL, TRIANGLE_FILL = 0.89, 0.64
#: a centroid that travels fewer pixels than this has not moved
MIN_TRAVEL = 3.0
#: a shape narrower than this is not judged
MIN_SHAPE_SIDE = 16


def what_is_drawn(frames: Any) -> dict[str, Any]:
    """The colour, shape and motion a picture or clip (uint8 or float in [0, 1], [F, H, W, 3]
    or [H, W, 3]) shows; each None where the pixels do not decide it."""
    import numpy as np

    pixels = np.asarray(frames)
    pixels = pixels.astype(np.float32) * (255.0 if pixels.dtype != np.uint8 else 1.0)
    pixels = pixels[None] if pixels.ndim == 3 else pixels
    mask = pixels.max(-1) - pixels.min(-1) > SATURATION
    seen: dict[str, Any] = {"colour": None, "shape": None, "motion": None, "coloured_pixels": int(mask.sum())}
    counts = mask.sum(axis=(1, 2))
    if counts.sum() < 4 * len(pixels):
        return seen
    mean = pixels[mask].mean(axis=0)
    seen["colour"] = min(COLOURS, key=lambda name: float(((np.array(COLOURS[name]) - mean) ** 2).sum()))
    fills = []
    for frame in mask:
        ys, xs = np.nonzero(frame)
        if len(xs) and min(np.ptp(xs), np.ptp(ys)) + 1 >= MIN_SHAPE_SIDE:
            fills.append(len(xs) / ((np.ptp(xs) + 1) * (np.ptp(ys) + 1)))
    if len(mask) == 1 and fills:  # a clip's shape is not judged: the video demos' shapes are 12 px, rounded by a small VAE
        fill = float(np.median(fills))
        seen["fill"] = round(fill, 3)
        seen["shape"] = "square" if fill > SQUARE_FILL else "triangle" if fill < TRIANGLE_FILL else "circle"
    if len(mask) > 1:
        ys, xs = np.mgrid[: mask.shape[1], : mask.shape[2]]
        present = [t for t in range(len(mask)) if counts[t] >= 3]
        if len(present) >= 2:
            half = max(1, len(present) // 3)
            centre = lambda ts: np.array([sum(float((xs * mask[t]).sum()) for t in ts), sum(float((ys * mask[t]).sum()) for t in ts)]) / sum(counts[t] for t in ts)  # noqa: E731
            dx, dy = centre(present[-half:]) - centre(present[:half])
            if max(abs(dx), abs(dy)) >= MIN_TRAVEL:
                step = (int(np.sign(dx)), 0) if abs(dx) > abs(dy) else (0, int(np.sign(dy)))
                seen["motion"] = next(name for name, way in MOVES.items() if way == step)
    return seen


def caption_agreement(frames: Any, caption: str) -> dict[str, Any] | None:
    """Whether ``frames`` show what the demo ``caption`` says: ``agrees`` (every part the pixels
    decide matches; the colour must be decided), and each part checked (``colour``, ``shape``,
    ``motion`` for a clip's caption), with ``seen`` (:func:`what_is_drawn`); None for a caption
    that is not a demo caption."""
    said = DEMO_CAPTION.match(" ".join(caption.lower().split()))
    if said is None or said["colour"] not in COLOURS or said["shape"] not in (*SHAPES, *MOVING_SHAPES) or (said["move"] and said["move"] not in MOVES):
        return None
    seen = what_is_drawn(frames)
    checks = {"colour": seen["colour"] == said["colour"]}
    if seen["shape"] is not None:
        checks["shape"] = seen["shape"] == said["shape"]
    if said["move"]:
        checks["motion"] = seen["motion"] == said["move"]
    return {"agrees": all(checks.values()), **checks, "seen": seen}


__all__ = ["DEMO_CAPTION", "caption_agreement", "what_is_drawn"]
