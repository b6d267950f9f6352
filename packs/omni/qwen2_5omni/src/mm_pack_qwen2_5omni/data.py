"""Qwen2.5-Omni's side of preprocessing: one conversation mixing ``<image>``, ``<video>``,
``<audio>`` and text.

Images and videos become ``<|vision_bos|> <|IMAGE|>/<|VIDEO|> * n <|vision_eos|>`` with the
Qwen vision patches (mm-qwen-vision); an audio clip is decoded at 16 kHz, turned into 128-mel
features by the Whisper feature extractor exactly as ``Qwen2_5OmniProcessor`` calls it (padded
to 30 s, then the valid frames kept) and becomes ``<|audio_bos|> <|AUDIO|> * n <|audio_eos|>``
with n the audio tower's output length (:mod:`mmcore.kits.mel_audio`).
"""

from __future__ import annotations

from typing import Any

from mmcore.data import ChatTemplateEncoder
from mmcore.kits import MelClipExpander
from mm_qwen_vision import QwenVisionExpanders

DEFAULT_SYSTEM = "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory and visual inputs, as well as generating text and speech."

# The chat template saved with tokenizers this pack writes (the Omni processor's content types).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>{% elif content['type'] == 'video' %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>{% elif content['type'] == 'audio' %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MEDIA_TOKENS = ("<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", "<|vision_bos|>", "<|vision_eos|>", "<|audio_bos|>", "<|audio_eos|>")


def audio_tokens(frames: int) -> int:
    """The audio tower's output length for ``frames`` mel frames (two stride-2 stages)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


class Encoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels, pixel patches and mel
    frames (``encode(sample).tensors``) through the tokenizer's chat template (this pack's where
    the tokenizer has none); ``truncate`` applies ``data.cutoff_len``."""

    def __init__(self, tokenizer: Any, feature_extractor: Any, data_cfg: Any, merge_size: int = 2) -> None:
        ids = tokenizer.convert_tokens_to_ids
        self.cfg = data_cfg
        vision = QwenVisionExpanders(
            data_cfg,
            merge_size,
            image_tokens=(ids("<|vision_bos|>"), ids("<|IMAGE|>"), ids("<|vision_eos|>")),
            video_tokens=(ids("<|vision_bos|>"), ids("<|VIDEO|>"), ids("<|vision_eos|>")),
            seconds_per_grid=True,
        )
        audio = MelClipExpander(
            feature_extractor, (ids("<|audio_bos|>"), ids("<|AUDIO|>"), ids("<|audio_eos|>")), audio_tokens, max_seconds=feature_extractor.n_samples / feature_extractor.sampling_rate
        )
        super().__init__(
            tokenizer,
            {"<image>": vision.image, "<video>": vision.video, "<audio>": audio},
            markers={"<image>": "<|vision_bos|><|IMAGE|><|vision_eos|>", "<video>": "<|vision_bos|><|VIDEO|><|vision_eos|>", "<audio>": "<|audio_bos|><|AUDIO|><|audio_eos|>"},
            chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[ids(t) for t in MEDIA_TOKENS],
        )
