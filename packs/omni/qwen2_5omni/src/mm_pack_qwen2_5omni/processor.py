"""The Qwen2.5-Omni processor without a video processor, for machines without torchvision.

transformers' ``Qwen2_5OmniProcessor`` insists on its torchvision-based video processor, so it
cannot be built on a CPU-only torch; this subclass keeps the image processor, the feature
extractor and the tokenizer (and ``__call__`` for text, images and audio). mmcore encodes
videos itself (PyAV + the image processor); on a machine with torchvision the stock processor
loads the exported folder as well.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2_5OmniProcessor
from transformers.processing_utils import ProcessorMixin

TOKEN_ATTRIBUTES = ("image_token", "audio_token", "video_token", "image_token_id", "audio_token_id", "video_token_id",
                    "vision_bos_token", "vision_eos_token", "audio_bos_token", "audio_eos_token")


class OmniProcessorWithoutVideo(Qwen2_5OmniProcessor):
    def __init__(self, image_processor: Any = None, feature_extractor: Any = None, tokenizer: Any = None, chat_template: str | None = None) -> None:
        ProcessorMixin.__init__(self, image_processor, feature_extractor, tokenizer, chat_template=chat_template)
        self.video_processor = None
        for name in TOKEN_ATTRIBUTES:
            setattr(self, name, getattr(tokenizer, name))
