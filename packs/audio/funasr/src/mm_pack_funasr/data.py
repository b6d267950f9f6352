"""Fun-ASR-Nano's side of preprocessing: a conversation with ``<audio>`` clips, through the
checkpoint's own chat template.

The template (transformers' conversion script stores it with the processor) writes a user turn
holding audio as ``语音转写：<|object_ref_start|>`` ("transcribe:"), naming the language where
the turn has a ``language`` part and turning the turn's text into context ("上下文信息") before
it; ``FunAsrNanoProcessor`` then repeats ``<|object_ref_start|>`` once per LFR feature row of
the clip (no start or end token, no downsampling: 60 ms of audio a token). A clip is decoded at
16 kHz, whole: the family's processor pads and truncates nothing and has no 30 s window; what
bounds a clip is the audio tower's sinusoidal position table (``max_position_embeddings`` - 1
rows, 2048 x 60 ms = 122.9 s for the released model), beyond which a clip is a bad sample
naming that limit (the original FunASR splits long recordings with a VAD model first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mmcore.data import ChatTemplateEncoder, MediaError, Piece

AUDIO_TOKEN = "<|object_ref_start|>"

# The checkpoint's chat template, as transformers' convert_fun_asr_nano_to_hf.py writes it.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% set audio_items = message['content'] | selectattr('type', 'equalto', 'audio') | list %}"
    "{% if message['role'] == 'user' and audio_items %}"
    "{% set text_items = message['content'] | selectattr('type', 'equalto', 'text') | list %}"
    "{% set keyword_items = message['content'] | selectattr('type', 'equalto', 'keywords') | list %}"
    "{% set language_items = message['content'] | selectattr('type', 'equalto', 'language') | list %}"
    "{% if text_items or keyword_items %}请结合上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。\n\n\n**上下文信息：**\n\n\n"
    "{% for item in text_items %}{{ item['text'] }}\n{% endfor %}"
    "{% set keyword_namespace = namespace(items=[]) %}{% for item in keyword_items %}"
    "{% set keyword_namespace.items = keyword_namespace.items + item['keywords'] %}{% endfor %}"
    "{% if keyword_namespace.items %}热词列表：[{{ keyword_namespace.items | join(', ') }}]\n{% endif %}{% endif %}"
    "语音转写{% if language_items %}成{{ language_items[0]['language'] }}{% endif %}："
    "{% for content in audio_items %}<|object_ref_start|>{% endfor %}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'audio' %}<|object_ref_start|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class LfrClipExpander:
    """``<audio>`` -> ``<|object_ref_start|>`` x rows and the clip's LFR features [rows, 560],
    as ``FunAsrNanoProcessor`` makes them for that clip (:mod:`mm_pack_funasr.features`)."""

    settings: Mapping[str, Any]
    audio_token: int
    max_rows: int

    def __call__(self, path: Path) -> Piece:
        from mmcore.data import load_audio
        from mm_pack_funasr.features import lfr_features

        rate = int(self.settings.get("sampling_rate", 16000))
        samples = load_audio(path, rate)
        features = lfr_features(samples, self.settings)
        rows = int(features.shape[0])
        if rows == 0:
            raise MediaError(f"audio {path} is empty (shorter than one 25 ms frame)")
        if rows > self.max_rows:
            limit = self.max_rows * self.settings.get("stride_lfr", 6) * self.settings.get("frame_shift", 10) / 1000
            raise MediaError(f"audio {path} is {len(samples) / rate:.1f} s, longer than the {limit:.1f} s the audio tower's positions cover (split it)")
        return Piece([self.audio_token] * rows, {"input_features": features.numpy(), "audio_feature_lengths": [rows]})


class Encoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels and LFR feature rows
    through the tokenizer's chat template (this pack's where the tokenizer has none)."""

    def __init__(self, tokenizer: Any, settings: Mapping[str, Any], data_cfg: Any, max_rows: int) -> None:
        self.cfg = data_cfg
        audio = tokenizer.convert_tokens_to_ids(AUDIO_TOKEN)
        super().__init__(
            tokenizer,
            {"<audio>": LfrClipExpander(settings, audio, max_rows)},
            markers={"<audio>": AUDIO_TOKEN},
            chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[audio],
        )
