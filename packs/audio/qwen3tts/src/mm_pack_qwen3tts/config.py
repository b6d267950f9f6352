"""The Qwen3-TTS ``config.json``, read as data: the talker and code-predictor sections become
transformers ``Qwen3Config`` objects (their backbones are transformers' ``Qwen3Model``), the
special codec / text ids a small dataclass.

Field names are the public ones (``talker_config``, ``talker_config.code_predictor_config``,
``codec_bos_id``, ``tts_pad_token_id``, ...), with the reference configuration classes' defaults
where a field is absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A folder that is not a loadable Qwen3-TTS checkpoint; the message is one line."""


@dataclass(frozen=True)
class SpecialIds:
    """The ids the prompt layout and decoding use (text ids index ``text_embedding``, codec ids
    ``codec_embedding`` / ``codec_head``)."""

    tts_pad: int = 151671
    tts_bos: int = 151672
    tts_eos: int = 151673
    codec_pad: int = 4196
    codec_bos: int = 4197
    codec_eos: int = 4198
    codec_think: int = 4202
    codec_nothink: int = 4203
    codec_think_bos: int = 4204
    codec_think_eos: int = 4205
    vocab_size: int = 3072
    num_code_groups: int = 32
    spk_id: dict[str, int] = field(default_factory=dict)
    codec_language_id: dict[str, int] = field(default_factory=dict)


def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: no config.json (a Qwen3-TTS folder holds config.json, model.safetensors and speech_tokenizer/)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") != "qwen3_tts" or not isinstance(cfg.get("talker_config"), dict):
        raise CheckpointError(f"{path}: not a Qwen3-TTS config (model_type {cfg.get('model_type') if isinstance(cfg, dict) else None!r}, expected 'qwen3_tts' with a talker_config)")
    return cfg


def backbone_config(section: dict[str, Any], where: str):  # type: ignore[no-untyped-def]
    """A transformers ``Qwen3Config`` for the decoder stack a section describes. The talker's
    M-RoPE (``rope_scaling.mrope_section``) gives every section the same position in speech
    generation (the reference's ``get_rope_index``: text-only, three equal rows), which is plain
    1-D RoPE; only the default rope type is accepted."""
    from transformers import Qwen3Config

    scaling = section.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{where}: rope type {rope_type!r} is not supported (only 'default', with or without mrope_section)")
    if section.get("use_sliding_window"):
        raise CheckpointError(f"{where}: use_sliding_window=true is not supported")
    hidden, heads = int(section.get("hidden_size", 1024)), int(section.get("num_attention_heads", 16))
    return Qwen3Config(
        vocab_size=1,  # unused: the public layout has no embed_tokens, inputs arrive as embeddings
        hidden_size=hidden,
        intermediate_size=int(section.get("intermediate_size", 2048)),
        num_hidden_layers=int(section.get("num_hidden_layers", 20)),
        num_attention_heads=heads,
        num_key_value_heads=int(section.get("num_key_value_heads", heads)),
        head_dim=int(section.get("head_dim", hidden // heads)),
        hidden_act=section.get("hidden_act", "silu"),
        max_position_embeddings=int(section.get("max_position_embeddings", 32768)),
        rms_norm_eps=float(section.get("rms_norm_eps", 1e-6)),
        rope_parameters={"rope_type": "default", "rope_theta": float(section.get("rope_theta", 10000.0))},
        attention_bias=bool(section.get("attention_bias", False)),
        attention_dropout=float(section.get("attention_dropout", 0.0)),
        tie_word_embeddings=False,
    )


def special_ids(cfg: dict[str, Any]) -> SpecialIds:
    talker = cfg["talker_config"]
    defaults = SpecialIds()
    return SpecialIds(
        tts_pad=int(cfg.get("tts_pad_token_id", defaults.tts_pad)),
        tts_bos=int(cfg.get("tts_bos_token_id", defaults.tts_bos)),
        tts_eos=int(cfg.get("tts_eos_token_id", defaults.tts_eos)),
        codec_pad=int(talker.get("codec_pad_id", defaults.codec_pad)),
        codec_bos=int(talker.get("codec_bos_id", defaults.codec_bos)),
        codec_eos=int(talker.get("codec_eos_token_id", defaults.codec_eos)),
        codec_think=int(talker.get("codec_think_id", defaults.codec_think)),
        codec_nothink=int(talker.get("codec_nothink_id", defaults.codec_nothink)),
        codec_think_bos=int(talker.get("codec_think_bos_id", defaults.codec_think_bos)),
        codec_think_eos=int(talker.get("codec_think_eos_id", defaults.codec_think_eos)),
        vocab_size=int(talker.get("vocab_size", defaults.vocab_size)),
        num_code_groups=int(talker.get("num_code_groups", defaults.num_code_groups)),
        spk_id={k.lower(): int(v) for k, v in (talker.get("spk_id") or {}).items()},
        codec_language_id={k.lower(): int(v) for k, v in (talker.get("codec_language_id") or {}).items()},
    )
