"""Built-in reward functions on generated pictures and videos (``RewardSpec(takes="image")``), for
the diffusion kit's GRPO (:mod:`mmcore.kits.diffusion.grpo`): rule scores on the decoded pixels
that run offline on the CPU.

An image reward is ``fn(images, prompts, **settings) -> list[float]``: ``images[i]`` one
sample's decoded frames, a numpy float32 array [F, H, W, 3] in [0, 1] (a picture is one frame),
``prompts[i]`` its caption.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

#: a pixel counts as coloured when its channels spread more than this (of 255): not the white
#: ground, not the grey of an untrained model (the demo checker's threshold)
SATURATION = 80
#: below this share of coloured pixels a picture has no colour to score
MIN_COLOURED = 0.01


def caption_colour(caption: str) -> str | None:
    """The first demo colour (:data:`mmcore.data.synthetic.COLOURS`) the caption names, or None."""
    from mmcore.data.synthetic import COLOURS

    return next((word for word in re.findall(r"[a-z]+", caption.lower()) if word in COLOURS), None)


def colour_share(frames: Any, colour: str) -> float:
    """The share of ``frames``' coloured pixels whose nearest demo colour is ``colour`` (over at
    least :data:`MIN_COLOURED` of all pixels, so a speck does not score 1)."""
    import numpy as np

    from mmcore.data.synthetic import COLOURS

    pixels = np.asarray(frames, dtype=np.float32).reshape(-1, 3) * 255.0
    coloured = pixels[pixels.max(-1) - pixels.min(-1) > SATURATION]
    if not len(coloured):
        return 0.0
    names = sorted(COLOURS)
    palette = np.array([COLOURS[n] for n in names], dtype=np.float32)
    nearest = ((coloured[:, None, :] - palette[None]) ** 2).sum(-1).argmin(-1)
    return float((nearest == names.index(colour)).sum()) / max(len(coloured), MIN_COLOURED * len(pixels))


def colour(images: Sequence[Any], prompts: Sequence[str], **_: Any) -> list[float]:
    """How much the caption's colour dominates the picture: :func:`colour_share` of the colour
    the caption names (red, green, blue or yellow); 0 for a caption that names none."""
    out = []
    for frames, caption in zip(images, prompts):
        named = caption_colour(caption)
        out.append(colour_share(frames, named) if named else 0.0)
    return out


def brightness(images: Sequence[Any], prompts: Sequence[str], **_: Any) -> list[float]:
    """The mean pixel value in [0, 1] (1: white)."""
    import numpy as np

    return [float(np.asarray(frames, dtype=np.float32).mean()) for frames in images]


__all__ = ["colour", "brightness", "caption_colour", "colour_share", "SATURATION", "MIN_COLOURED"]
