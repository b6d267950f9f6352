"""GLM-4.1V's side of preprocessing: its chat template and its image and video tokens.

An image becomes ``<|begin_of_image|>`` + ``<|image|>`` x (patches / 4) + ``<|end_of_image|>``
with ``pixel_values``/``image_grid_thw`` from transformers' PIL GLM-4V image processor (no
torchvision). A video (frames sampled with PyAV, paired into temporal patches) becomes, inside
the template's ``<|begin_of_video|> ... <|end_of_video|>``, per temporal patch
``<|begin_of_image|>`` + ``<|image|>`` x n + ``<|end_of_image|>`` + the whole second of its first
frame, as ``Glm4vProcessor`` writes it.

GLM's own template ends an assistant turn with nothing (the next ``<|user|>`` starts), so
nothing would teach a model to stop; this pack encodes with its template, the official layout
with ``<|endoftext|>`` after each answer (as LLaMA-Factory trains GLM), whatever the tokenizer
carries.
"""

from __future__ import annotations

from typing import Any

from mmcore.data import ChatTemplateEncoder, MediaError, Sample
from mm_qwen_vision import QwenVisionExpanders, SampledVideo

IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"
VIDEO = "<|begin_of_video|><|video|><|end_of_video|>"

CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    + IMAGE
    + "{% elif content['type'] == 'video' %}"
    + VIDEO
    + "{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{% if message['role'] == 'assistant' %}<|endoftext|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def image_processor(min_pixels: int, max_pixels: int) -> Any:
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    return Glm4vImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


class Encoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels and pixel patches."""

    def __init__(self, tokenizer: Any, data_cfg: Any, merge_size: int = 2) -> None:
        ids = tokenizer.convert_tokens_to_ids
        start, image, end = ids("<|begin_of_image|>"), ids("<|image|>"), ids("<|end_of_image|>")
        video_start, video_end = ids("<|begin_of_video|>"), ids("<|end_of_video|>")

        def video_ids(grid: list[int], video: SampledVideo, per_patch: int) -> list[int]:
            out = [video_start]
            for first in video.indices[::2]:  # the processor's metadata.timestamps[::2]
                out += [start, *[image] * per_patch, end] + tokenizer(str(int(first / video.source_fps)), add_special_tokens=False)["input_ids"]
            return out + [video_end]

        vision = QwenVisionExpanders(data_cfg, merge_size, image_tokens=(start, image, end), video_tokens=(video_start, image, video_end), processor=image_processor, video_ids=video_ids)
        super().__init__(
            tokenizer,
            {"<image>": vision.image, "<video>": vision.video},
            markers={"<image>": IMAGE, "<video>": VIDEO},
            chat_template=CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[start, image, end, video_start, video_end],
        )

    def encode(self, sample: Sample) -> Any:
        return super().encode(one_kind(sample))

    def encode_prompt(self, sample: Sample) -> Any:
        return super().encode_prompt(one_kind(sample))


def one_kind(sample: Sample) -> Sample:
    if sample.images and sample.videos:
        raise MediaError("GLM-4V takes images or videos in one sample, not both (transformers' model marks both with one token)")
    return sample
