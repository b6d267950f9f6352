"""The Qwen3-Omni processor without its torchvision video processor (text, images, audio):
see :mod:`mm_qwen_vision.processors`."""

from __future__ import annotations

from transformers import Qwen3OmniMoeProcessor

from mm_qwen_vision.processors import WithoutVideoProcessor


class OmniProcessorWithoutVideo(WithoutVideoProcessor, Qwen3OmniMoeProcessor):
    pass
