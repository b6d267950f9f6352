"""Preprocessing as transformers' ``Qwen3VLProcessor`` does it, for the families that use that
processor (Qwen3-VL, Qwen3.5, dense and MoE): the chat template and the vision expanders.

A sample becomes ``input_ids``, ``labels`` (-100 outside assistant turns), and for its media
``pixel_values``/``image_grid_thw`` and ``pixel_values_videos``/``video_grid_thw`` as the processor
makes them: transformers' PIL image processor with 16-pixel patches (no torchvision), video frames
sampled with PyAV and paired into temporal patches, and before each temporal patch the
``<t seconds>`` text of its frames' mean time, inside the template's
``<|vision_start|> … <|vision_end|>`` (the processor replaces only the video pad).
"""

from __future__ import annotations

from typing import Any

from mmcore.data import ChatTemplateEncoder
from mm_qwen_vision import QwenVisionExpanders, SampledVideo, frame_timestamps

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"

# The chat template saved with tokenizers the packs write (Qwen3-VL Instruct's layout: no
# default system prompt), so exported models format conversations as training did.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    + IMAGE
    + "{% elif content['type'] == 'video' %}"
    + VIDEO
    + "{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Qwen3VLEncoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels and pixel patches through
    the tokenizer's chat template (:data:`CHAT_TEMPLATE` where the tokenizer has none)."""

    def __init__(self, tokenizer: Any, data_cfg: Any, mean_std: tuple[float, float], merge_size: int = 2, patch_size: int = 16) -> None:
        ids = tokenizer.convert_tokens_to_ids
        start, pad, end = ids("<|vision_start|>"), ids("<|video_pad|>"), ids("<|vision_end|>")

        def video_ids(grid: list[int], video: SampledVideo, per_patch: int) -> list[int]:
            out = [start]
            for seconds in frame_timestamps(video.indices, video.source_fps):
                out += tokenizer(f"<{seconds:.1f} seconds>", add_special_tokens=False)["input_ids"] + [start, *[pad] * per_patch, end]
            return out + [end]

        vision = QwenVisionExpanders(
            data_cfg,
            merge_size,
            image_tokens=(start, ids("<|image_pad|>"), end),
            video_tokens=(start, pad, end),
            patch_size=patch_size,
            mean_std=mean_std,
            video_ids=video_ids,
        )
        super().__init__(
            tokenizer,
            {"<image>": vision.image, "<video>": vision.video},
            markers={"<image>": IMAGE, "<video>": VIDEO},
            chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")],
        )


__all__ = ["Qwen3VLEncoder", "CHAT_TEMPLATE", "IMAGE", "VIDEO"]
