"""Qwen2.5-Omni's side of preprocessing: one conversation mixing ``<image>``, ``<video>``,
``<audio>`` and text.

Images and videos become ``<|vision_bos|> <|IMAGE|>/<|VIDEO|> * n <|vision_eos|>`` with the
Qwen vision patches (mmcore's shared code); an audio clip is decoded at 16 kHz, turned into
128-mel features by the Whisper feature extractor exactly as ``Qwen2_5OmniProcessor`` calls it
(padded to 30 s, then the valid frames kept) and becomes ``<|audio_bos|> <|AUDIO|> * n
<|audio_eos|>`` with n the audio tower's output length. Stored per sample: the valid mel
frames of all its clips, concatenated (``input_features`` [frames, mels]), and each clip's
frame count (``audio_feature_lengths``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.data.chat_template import ChatTemplateEncoder, Piece
from mmcore.data.media import MediaError
from mm_qwen_vision import QwenVisionExpanders

DEFAULT_SYSTEM = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
                  "auditory and visual inputs, as well as generating text and speech.")

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


class AudioExpander:
    """``<audio>`` -> tokens and valid mel frames, as the Omni processor makes them."""

    def __init__(self, feature_extractor: Any, tokens: tuple[int, int, int]) -> None:
        self.fe = feature_extractor
        self.tokens = tokens

    def __call__(self, path: Path) -> Piece:
        from mmcore.data.audio import load_audio

        samples = load_audio(path, self.fe.sampling_rate)
        if len(samples) > self.fe.n_samples:
            raise MediaError(f"audio {path} is {len(samples) / self.fe.sampling_rate:.1f} s, longer than the {self.fe.n_samples / self.fe.sampling_rate:g} s the audio tower takes (split it)")
        out = self.fe(samples, sampling_rate=self.fe.sampling_rate, return_attention_mask=True, return_tensors="np")
        frames = int(out["attention_mask"][0].sum())
        bos, pad, eos = self.tokens
        features = out["input_features"][0][:, :frames].T.copy()  # [frames, mels]
        return Piece([bos, *[pad] * audio_tokens(frames), eos], {"input_features": features, "audio_feature_lengths": [frames]})


class Encoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels, pixel patches and mel
    frames (``encode(sample).tensors``) through the tokenizer's chat template (this pack's where
    the tokenizer has none); ``truncate`` applies ``data.cutoff_len``."""

    def __init__(self, tokenizer: Any, feature_extractor: Any, data_cfg: Any, merge_size: int = 2) -> None:
        ids = tokenizer.convert_tokens_to_ids
        self.cfg = data_cfg
        vision = QwenVisionExpanders(
            data_cfg, merge_size,
            image_tokens=(ids("<|vision_bos|>"), ids("<|IMAGE|>"), ids("<|vision_eos|>")),
            video_tokens=(ids("<|vision_bos|>"), ids("<|VIDEO|>"), ids("<|vision_eos|>")),
            seconds_per_grid=True,
        )
        audio = AudioExpander(feature_extractor, (ids("<|audio_bos|>"), ids("<|AUDIO|>"), ids("<|audio_eos|>")))
        super().__init__(
            tokenizer, {"<image>": vision.image, "<video>": vision.video, "<audio>": audio},
            markers={"<image>": "<|vision_bos|><|IMAGE|><|vision_eos|>", "<video>": "<|vision_bos|><|VIDEO|><|vision_eos|>",
                     "<audio>": "<|audio_bos|><|AUDIO|><|audio_eos|>"},
            chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt, media_token_ids=[ids(t) for t in MEDIA_TOKENS],
        )

