"""Qwen3-VL's side of preprocessing: ``Qwen3VLProcessor``'s, shared with Qwen3.5 in
:mod:`mm_qwen_vision.qwen3vl_processor` (chat template, 16-pixel patches with mean/std 0.5, the
``<t seconds>`` text before each temporal patch of a video)."""

from __future__ import annotations

from typing import Any

from mm_qwen_vision.qwen3vl_processor import CHAT_TEMPLATE, IMAGE, VIDEO, Qwen3VLEncoder

from mm_pack_qwen3vl.family import MEAN_STD


class Encoder(Qwen3VLEncoder):
    """Qwen3-VL's encoder: :class:`~mm_qwen_vision.qwen3vl_processor.Qwen3VLEncoder` with its mean/std."""

    def __init__(self, tokenizer: Any, data_cfg: Any, merge_size: int = 2, patch_size: int = 16) -> None:
        super().__init__(tokenizer, data_cfg, MEAN_STD, merge_size=merge_size, patch_size=patch_size)


__all__ = ["Encoder", "CHAT_TEMPLATE", "IMAGE", "VIDEO"]
