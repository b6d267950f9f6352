"""DeepSeek-OCR's image -> views and ``<image>`` tokens, as the reference's ``infer`` (and its
vLLM processor) prepares them, on PIL and numpy (the reference's transform needs torchvision,
which does not load beside the CPU torch).

The modes are its ``(base_size, image_size, crop_mode)``: Tiny (512, 512, off), Small (640, 640,
off), Base (1024, 1024, off), Large (1280, 1280, off), Gundam (1024, 640, on).

* crop mode: an image wider or taller than a tile (``image_size``) is cut into tiles: among the
  grids of ``min_tiles``..``max_tiles`` tiles, the one whose aspect ratio is closest to the
  image's (a tie goes to the larger grid when the image covers more than half of it), the image
  stretched onto that grid and cut row by row; the global view is the image fitted into
  ``base_size`` x ``base_size``, centred, padded with the mean grey (127);
* without crop mode: one view of ``image_size``: stretched onto the square when its grid is at
  most 10 x 10 tokens (Tiny and Small: the reference resizes at ``image_size <= 640``), else
  fitted and padded as above;
* pixels: ``(x / 255 - 0.5) / 0.5``;
* tokens: ``n = ceil((size // patch) / 4)`` per side of a view; ``n (n + 1)`` for the global view
  (a newline per row) plus the separator, and with tiles ``(down n) (across n + 1)`` more.

The reference's crop threshold is the literal 640 (Gundam's tile); here it is the tile size, the
same in Gundam.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

GREY = (127, 127, 127)  # int(0.5 * 255) per channel: the image mean, the padding colour
DOWNSAMPLE = 4  # the SAM's two stride-2 convolutions
STRETCHED = 10  # views of at most this many tokens a side are stretched (640 // 16 // 4)


def per_side(size: int, patch: int) -> int:
    return math.ceil((size // patch) / DOWNSAMPLE)


def tile_grid(size: tuple[int, int], tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(across, down) tiles for an image of ``size`` (w, h), as the reference chooses them."""
    width, height = size
    aspect = width / height
    grids = {(i, j) for n in range(min_tiles, max_tiles + 1) for i in range(1, n + 1) for j in range(1, n + 1) if min_tiles <= i * j <= max_tiles}
    best, best_diff = (1, 1), math.inf
    for across, down in sorted(grids, key=lambda g: g[0] * g[1]):
        diff = abs(aspect - across / down)
        if diff < best_diff:
            best, best_diff = (across, down), diff
        elif diff == best_diff and width * height > 0.5 * tile * tile * across * down:
            best = (across, down)
    return best


def views(image: Any, base: int, tile: int, crop: bool, patch: int, min_tiles: int = 2, max_tiles: int = 9) -> tuple[Any, list[Any], tuple[int, int], int]:
    """The global view, the tiles (PIL images), the grid (across, down) and the image's token count."""
    from PIL import ImageOps

    if not crop:
        n = per_side(tile, patch)
        view = image.resize((tile, tile)) if n <= STRETCHED else image
        return ImageOps.pad(view, (tile, tile), color=GREY), [], (1, 1), n * (n + 1) + 1
    tiles, grid = [], (1, 1)
    if image.size[0] > tile or image.size[1] > tile:
        grid = tile_grid(image.size, tile, min_tiles, max_tiles)
        stretched = image.resize((tile * grid[0], tile * grid[1]))
        tiles = [stretched.crop((x * tile, y * tile, (x + 1) * tile, (y + 1) * tile)) for y in range(grid[1]) for x in range(grid[0])]
    n, t = per_side(base, patch), per_side(tile, patch)
    count = n * (n + 1) + 1 + (grid[1] * t * (grid[0] * t + 1) if tiles else 0)
    return ImageOps.pad(image, (base, base), color=GREY), tiles, grid, count


def normalised(images: list[Any]) -> Any:
    import numpy as np

    pixels = np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images]).astype(np.float32) / np.float32(255)
    return ((pixels - np.float32(0.5)) / np.float32(0.5)).transpose(0, 3, 1, 2).copy()


class OcrImages:
    """``<image>`` -> its tokens and arrays (``pixel_values`` [1, 3, V, V], ``images_spatial_crop``
    [1, 2], and for a tiled image ``pixel_values_local`` [tiles, 3, T, T]): the VLM kit's image expander."""

    token = "<image>"

    def __init__(self, token_id: int, patch: int, base: int, tile: int, crop: bool, min_tiles: int = 2, max_tiles: int = 9) -> None:
        self.token_id, self.patch, self.base, self.tile, self.crop = token_id, patch, base, tile, crop
        self.min_tiles, self.max_tiles = min_tiles, max_tiles

    def __call__(self, path: Path) -> Any:
        import numpy as np

        from mmcore.data import Piece, load_image

        glob, tiles, (across, down), count = views(load_image(path), self.base, self.tile, self.crop, self.patch, self.min_tiles, self.max_tiles)
        arrays = {"pixel_values": normalised([glob]), "images_spatial_crop": np.array([[across, down]], dtype=np.int64)}
        if tiles:
            arrays["pixel_values_local"] = normalised(tiles)
        return Piece([self.token_id] * count, arrays)


__all__ = ["per_side", "tile_grid", "views", "normalised", "OcrImages"]
