"""Qwen3-Omni's side of preprocessing: one conversation mixing ``<image>``, ``<video>``,
``<audio>`` and text, as ``Qwen3OmniMoeProcessor`` writes it.

Images and videos become ``<|vision_start|> <|image_pad|>/<|video_pad|> * n <|vision_end|>``
with Qwen3's vision patches (16 px, mean/std 0.5, mm-qwen-vision) and, for a video, its
seconds per temporal patch (``temporal_patch_size / fps``: the time axis of M-RoPE); no
timestamps are written into the text (unlike Qwen3-VL). An audio clip is decoded at 16 kHz,
turned into 128-mel frames as the processor calls the feature extractor (``padding=True``, no
truncation: a clip may be longer than 30 s, the tower reads it in 1 s windows) and becomes
``<|audio_start|> <|audio_pad|> * n <|audio_end|>`` with n from the tower's windows
(:func:`audio_tokens`).
"""

from __future__ import annotations

from typing import Any

from mmcore.data import ChatTemplateEncoder
from mmcore.kits import MelClipExpander
from mm_qwen_vision import QwenVisionExpanders

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
AUDIO = "<|audio_start|><|audio_pad|><|audio_end|>"
MEAN_STD = (0.5, 0.5)  # Qwen3-Omni's image_mean / image_std, every channel

# The chat template saved with tokenizers this pack writes (Qwen3-Omni Instruct's layout: no
# default system prompt), so exported models format conversations as training did.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    + IMAGE
    + "{% elif content['type'] == 'video' %}"
    + VIDEO
    + "{% elif content['type'] == 'audio' %}"
    + AUDIO
    + "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MEDIA_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|audio_pad|>", "<|vision_start|>", "<|vision_end|>", "<|audio_start|>", "<|audio_end|>")


def audio_tokens(frames: int, n_window: int = 50) -> int:
    """The audio tower's output length for ``frames`` mel frames: 13 per full window of
    ``2 x n_window`` frames (three stride-2 convolutions), and what the remainder makes
    (transformers' ``_get_feat_extract_output_lengths``)."""
    window = 2 * n_window
    rest = (frames % window - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + frames // window * 13


class Encoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels, pixel patches and mel
    frames through the tokenizer's chat template (this pack's where the tokenizer has none)."""

    def __init__(self, tokenizer: Any, feature_extractor: Any, data_cfg: Any, merge_size: int = 2, patch_size: int = 16, n_window: int = 50) -> None:
        ids = tokenizer.convert_tokens_to_ids
        start, end = ids("<|vision_start|>"), ids("<|vision_end|>")
        vision = QwenVisionExpanders(
            data_cfg,
            merge_size,
            image_tokens=(start, ids("<|image_pad|>"), end),
            video_tokens=(start, ids("<|video_pad|>"), end),
            seconds_per_grid=True,
            patch_size=patch_size,
            mean_std=MEAN_STD,
        )
        audio = MelClipExpander(feature_extractor, (ids("<|audio_start|>"), ids("<|audio_pad|>"), ids("<|audio_end|>")), lambda frames: audio_tokens(frames, n_window), pad_to_window=False)
        super().__init__(
            tokenizer,
            {"<image>": vision.image, "<video>": vision.video, "<audio>": audio},
            markers={"<image>": IMAGE, "<video>": VIDEO, "<audio>": AUDIO},
            chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[ids(t) for t in MEDIA_TOKENS],
        )
