"""The Qwen omni processors without their video processor, for machines without torchvision.

transformers' ``Qwen2_5OmniProcessor`` and ``Qwen3OmniMoeProcessor`` insist on their
torchvision-based video processor, so they cannot be built on a CPU-only torch. A pack's
``class OmniProcessorWithoutVideo(WithoutVideoProcessor, <the family's processor>)`` keeps the
image processor, the feature extractor and the tokenizer (and ``__call__`` for text, images and
audio): the tiny checkpoints save their processor files with it and the parity tests compare
against it. mmcore encodes videos itself (PyAV + the image processor); on a machine with
torchvision the stock processor loads the same folders.
"""

from __future__ import annotations

from typing import Any

#: tokenizer attributes the omni processors copy onto themselves
OMNI_TOKEN_ATTRIBUTES = (
    "image_token",
    "audio_token",
    "video_token",
    "image_token_id",
    "audio_token_id",
    "video_token_id",
    "vision_bos_token",
    "vision_eos_token",
    "audio_bos_token",
    "audio_eos_token",
)


class WithoutVideoProcessor:
    """Mixin, first among the bases: builds the processor from its other parts alone."""

    def __init__(self, image_processor: Any = None, feature_extractor: Any = None, tokenizer: Any = None, chat_template: str | None = None) -> None:
        from transformers.processing_utils import ProcessorMixin

        # transformers reads the parts from this signature (ProcessorMixin.get_attributes)
        ProcessorMixin.__init__(self, image_processor, feature_extractor, tokenizer, chat_template=chat_template)  # type: ignore[arg-type]
        self.video_processor = None
        for name in OMNI_TOKEN_ATTRIBUTES:
            setattr(self, name, getattr(tokenizer, name))
