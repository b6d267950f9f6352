"""Kimi-K2.5's image processor on PIL and NumPy (transformers' ``Kimi_K25ImageProcessor`` is a
torchvision one, and torchvision does not load beside the CPU torch): the same steps in the same
order. Each image is scaled down (never up) to at most ``max_patches`` patches and
``size["max_height"]`` patches a side (``navit_resize``), padded at the bottom and right to a
multiple of ``patch_size x merge_size`` pixels, rescaled, normalised and cut into
``patch_size``-pixel patches, row by row: ``pixel_values`` [patches, 3, p, p] and
``image_grid_thw`` [images, 3] (t = 1), the layout the model reads.

:class:`KimiK25ImagesProcessor` is ``Kimi_K25Processor`` without its video processor (also a
torchvision one, which the processor's type check would look up): the library's own text side,
``<|media_pad|>`` widened to ``grid_h x grid_w / merge_size^2`` tokens by its ``replace_image_token``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from transformers.image_processing_backends import PilBackend
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling, SizeDict
from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor
from transformers.processing_utils import ImagesKwargs, ProcessorMixin


class KimiK25ImageKwargs(ImagesKwargs, total=False):
    max_patches: int
    patch_size: int
    merge_size: int


def navit_resize(height: int, width: int, patch_size: int, merge_kernel_size: int, max_patches: int, max_size_per_side: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(resized height, width), (padded height, width): transformers' ``navit_resize`` for
    Kimi-K2.5, step for step (the parity test runs the library's own function beside it)."""
    patches_h = max(1.0, height // patch_size)
    patches_w = max(1.0, width // patch_size)
    scale = min(1.0, math.sqrt(max_patches / (patches_h * patches_w)), (max_size_per_side * patch_size) / height, (max_size_per_side * patch_size) / width)
    new_height, new_width = max(1, int(height * scale)), max(1, int(width * scale))
    new_height = min(new_height, max_size_per_side * patch_size)
    new_width = min(new_width, max_size_per_side * patch_size)
    factor = merge_kernel_size * patch_size
    return (new_height, new_width), ((factor - new_height % factor) % factor + new_height, (factor - new_width % factor) % factor + new_width)


class KimiK25ImageProcessorPil(PilBackend):
    do_resize = True
    resample = PILImageResampling.BICUBIC
    size = {"max_height": 512, "max_width": 512}
    max_patches = 16384
    do_rescale = True
    do_normalize = True
    image_mean = IMAGENET_STANDARD_MEAN
    image_std = IMAGENET_STANDARD_STD
    do_convert_rgb = True
    patch_size = 14
    merge_size = 2
    valid_kwargs = KimiK25ImageKwargs
    model_input_names = ["pixel_values", "image_grid_thw"]

    def _preprocess(  # type: ignore[override]
        self,
        images: list[np.ndarray],
        do_resize: bool,
        size: SizeDict,
        resample: Any,
        do_rescale: bool,
        rescale_factor: float,
        do_normalize: bool,
        image_mean: Any,
        image_std: Any,
        patch_size: int,
        merge_size: int,
        max_patches: int,
        return_tensors: Any = None,
        **kwargs: Any,
    ) -> BatchFeature:
        pixels, grids = [], []
        for image in images:  # channels first
            height, width = image.shape[-2:]
            if do_resize:
                (new_h, new_w), (pad_h, pad_w) = navit_resize(height, width, patch_size, merge_size, max_patches, size.max_height)
                image = self.resize(image, SizeDict(height=new_h, width=new_w), resample=resample)
                image = self.pad([image], pad_size=SizeDict(height=pad_h, width=pad_w))[0]
            if do_rescale:
                image = self.rescale(image, rescale_factor)
            if do_normalize:
                image = self.normalize(image, image_mean, image_std)
            channels, height, width = image.shape
            grid_h, grid_w = height // patch_size, width // patch_size
            patches = image.reshape(channels, grid_h, patch_size, grid_w, patch_size).transpose(1, 3, 0, 2, 4)
            pixels.append(patches.reshape(grid_h * grid_w, channels, patch_size, patch_size).astype(np.float32))
            grids.append([1, grid_h, grid_w])
        return BatchFeature(data={"pixel_values": np.concatenate(pixels), "image_grid_thw": np.array(grids, dtype=np.int64)}, tensor_type=return_tensors)

    def get_number_of_image_patches(self, height: int, width: int, images_kwargs: dict | None = None) -> int:
        kw = {"patch_size": self.patch_size, "merge_size": self.merge_size, "max_patches": self.max_patches, "side": self.size["max_height"], **(images_kwargs or {})}
        _, (pad_h, pad_w) = navit_resize(height, width, kw["patch_size"], kw["merge_size"], kw["max_patches"], kw["side"])
        return (pad_h // kw["patch_size"]) * (pad_w // kw["patch_size"])


class KimiK25ImagesProcessor(Kimi_K25Processor):
    """``Kimi_K25Processor`` for images and text (no video processor)."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None, **kwargs: Any) -> None:
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
        self.image_token = getattr(tokenizer, "image_token", None) or "<|media_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token = getattr(tokenizer, "video_token", None) or "<|kimi_k25_video_placeholder|>"
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
