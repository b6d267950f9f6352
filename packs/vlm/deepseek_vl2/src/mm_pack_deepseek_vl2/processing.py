"""DeepSeek-VL2's dynamic tiling, as the public processor (``DeepseekVLV2Processor``) does it,
written here on PIL and numpy (the public one needs torchvision, which does not load beside the
CPU torch):

* the tile grid: among ``candidate_resolutions`` (multiples of the view size S), the one that
  keeps the most of the image after an aspect-preserving fit (``min(fitted area, image area)``),
  ties broken by the least padding; without cropping, one S x S tile;
* the views: a global view (the image fitted into S x S, centred, padded with grey 127) and the
  tiles of the image fitted the same way into the chosen resolution, row by row;
* normalisation: ``(x / 255 - 0.5) / 0.5``;
* the tokens of one image: ``n = ceil((S // patch) / downsample)`` per side;
  ``n (n + 1)`` for the global view (a newline per row), one separator, and
  ``(down n) (across n + 1)`` for the tiles.

The public processor crops only in conversations of at most two images; here ``data.image_crop``
decides for every image.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

GREY = (127, 127, 127)  # int(0.5 * 255): the image mean, the padding colour


def best_resolution(size: tuple[int, int], candidates: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The (width, height) of ``candidates`` that keeps the most of an image of ``size`` (w, h)."""
    width, height = size
    best, kept, wasted = (int(candidates[0][0]), int(candidates[0][1])), -1, math.inf
    for cw, ch in candidates:
        scale = min(cw / width, ch / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        waste = cw * ch - effective
        if effective > kept or (effective == kept and waste < wasted):
            best, kept, wasted = (int(cw), int(ch)), effective, waste
    return best


def image_tokens(across: int, down: int, per_side: int) -> int:
    """Tokens of one image of ``across`` x ``down`` tiles (global view, separator, tiles)."""
    return per_side * (per_side + 1) + 1 + down * per_side * (across * per_side + 1)


def views(image: Any, view: int, candidates: Sequence[Sequence[int]], crop: bool) -> tuple[list[Any], tuple[int, int]]:
    """The global view and the tiles (PIL images, S x S) and the grid (across, down)."""
    from PIL import ImageOps

    width, height = best_resolution(image.size, candidates) if crop else (view, view)
    out = [ImageOps.pad(image, (view, view), color=GREY)]
    fitted = ImageOps.pad(image, (width, height), color=GREY)
    out += [fitted.crop((x, y, x + view, y + view)) for y in range(0, height, view) for x in range(0, width, view)]
    return out, (width // view, height // view)


def normalised(images: list[Any]) -> Any:
    import numpy as np

    pixels = np.stack([np.asarray(im, dtype=np.uint8) for im in images]).astype(np.float32) / np.float32(255)
    return ((pixels - np.float32(0.5)) / np.float32(0.5)).transpose(0, 3, 1, 2).copy()


class TiledImages:
    """``<image>`` -> its tokens and arrays (``pixel_values`` [views, 3, S, S],
    ``images_spatial_crop`` [1, 2]): the VLM kit's image expander."""

    token = "<image>"

    def __init__(self, config: Any, token_id: int, crop: bool = True) -> None:
        from mm_pack_deepseek_vl2.model import tokens_per_side

        self.view = int(config.siglip_config.image_size)
        self.candidates = config.candidate_resolutions
        self.per_side = tokens_per_side(config)
        self.token_id = token_id
        self.crop = crop

    def __call__(self, path: Path) -> Any:
        import numpy as np

        from mmcore.data import Piece, load_image

        images, (across, down) = views(load_image(path), self.view, self.candidates, self.crop)
        ids = [self.token_id] * image_tokens(across, down, self.per_side)
        return Piece(ids, {"pixel_values": normalised(images), "images_spatial_crop": np.array([[across, down]], dtype=np.int64)})


__all__ = ["best_resolution", "image_tokens", "views", "normalised", "TiledImages"]
