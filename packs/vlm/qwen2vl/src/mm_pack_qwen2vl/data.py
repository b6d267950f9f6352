"""Qwen2-VL's side of preprocessing: chat template, label masking, image and video patches.

A sample becomes ``input_ids``, ``labels`` (-100 outside assistant turns), and for its media
``pixel_values``/``image_grid_thw`` and ``pixel_values_videos``/``video_grid_thw`` exactly as
``Qwen2VLProcessor`` would make them (the image processor is transformers' own; video frames go
through it too, then are paired into temporal patches).
"""

from __future__ import annotations

from typing import Any

from mmcore.data import IGNORE, ChatTemplateEncoder
from mm_qwen_vision import QwenVisionExpanders, image_processor, load_video_frames, video_patches
from mmcore.data import MediaError, load_image

__all__ = ["IGNORE", "MediaError", "load_image", "Encoder", "image_processor", "load_video_frames", "video_patches"]

DEFAULT_SYSTEM = "You are a helpful assistant."

# The chat template saved with tokenizers this pack writes, so that exported models format
# conversations for inference the same way training did.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Encoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels and pixel patches
    (``encode(sample).tensors``) through the tokenizer's chat template (this pack's where the
    tokenizer has none); ``truncate`` applies ``data.cutoff_len``."""

    def __init__(self, tokenizer: Any, data_cfg: Any, merge_size: int = 2) -> None:
        ids = tokenizer.convert_tokens_to_ids
        self.cfg = data_cfg
        vision = QwenVisionExpanders(
            data_cfg,
            merge_size,
            image_tokens=(ids("<|vision_start|>"), ids("<|image_pad|>"), ids("<|vision_end|>")),
            video_tokens=(ids("<|vision_start|>"), ids("<|video_pad|>"), ids("<|vision_end|>")),
        )
        super().__init__(
            tokenizer,
            {"<image>": vision.image, "<video>": vision.video},
            markers={"<image>": "<|vision_start|><|image_pad|><|vision_end|>", "<video>": "<|vision_start|><|video_pad|><|vision_end|>"},
            chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")],
        )
