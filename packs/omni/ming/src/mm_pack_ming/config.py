"""Ming-Lite-Omni's ``config.json``, read the way the release's ``BailingMMConfig`` reads it.

``inclusionAI/Ming-Lite-Omni`` ships one ``config.json`` with three nested sections and
``mlp_depth``: ``llm_config`` (a ``BailingMoeConfig``: Ling-lite), ``vision_config`` (a
Qwen2.5-VL vision config), ``audio_config`` (a ``GLMAudioConfig`` wrapping the FunASR
``SANMEncoder`` keyword arguments in ``audio_encoder_config_sanm``) and, in releases that
carry the speech head, ``talker_config``. Fields the file leaves out take the reference
classes' defaults (:data:`LLM_DEFAULTS`, :data:`AUDIO_DEFAULTS`); a field of the wrong type
or a value the model cannot be built with is one line naming the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mmcore import read_json_object
from mmcore.errors import StageError

CONFIG = "config.json"

# BailingMoeConfig's defaults for the fields the decoder reads (configuration_bailing_moe.py).
LLM_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30592,
    "hidden_size": 1024,
    "intermediate_size": None,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 0,
    "head_dim": None,
    "hidden_act": "silu",
    "use_qkv_bias": False,
    "use_bias": True,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 16384,
    "num_experts": 16,
    "num_shared_experts": 0,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "moe_intermediate_size": None,
    "first_k_dense_replace": 0,
    "multi_gate": False,
    "norm_head": False,
    "pad_token_id": 126081,
    "eos_token_id": 126081,
    "image_patch_token": 126346,
    "tie_word_embeddings": False,
}

# GLMAudioConfig's defaults, and SANMEncoder's for the keyword arguments it is built with.
AUDIO_DEFAULTS: dict[str, Any] = {"audio_encoder_output_size": 512, "ds_conv_type": "conv", "ds_kernel_size": 1, "ds_stride": 1, "norm_query_embeds": True}
SANM_DEFAULTS: dict[str, Any] = {
    "input_size": 560,
    "output_size": 256,
    "attention_heads": 4,
    "linear_units": 2048,
    "num_blocks": 6,
    "input_layer": "conv2d",
    "normalize_before": True,
    "kernel_size": 11,
    "sanm_shfit": 0,
    "selfattention_layer_type": "sanm",
    "tp_blocks": 0,
}

VISION_FIELDS = (
    "depth",
    "hidden_size",
    "hidden_act",
    "intermediate_size",
    "num_heads",
    "in_channels",
    "patch_size",
    "spatial_merge_size",
    "temporal_patch_size",
    "tokens_per_second",
    "window_size",
    "out_hidden_size",
    "fullatt_block_indexes",
)


@dataclass
class MingConfig:
    llm: SimpleNamespace
    vision: dict[str, Any]
    audio: SimpleNamespace | None
    sanm: SimpleNamespace | None
    mlp_depth: int = 1
    has_talker: bool = False
    raw: dict[str, Any] = field(default_factory=dict)

    def get_text_config(self, *_: Any, **__: Any) -> SimpleNamespace:
        """The decoder's fields (what the kits read for FLOPs and shapes)."""
        return self.llm

    def vision_config(self):  # type: ignore[no-untyped-def]
        """transformers' ``Qwen2_5_VLVisionConfig`` with the release's vision fields."""
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

        return Qwen2_5_VLVisionConfig(**{k: self.vision[k] for k in VISION_FIELDS if k in self.vision})


def _typed(path: Path, section: str, data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, default in defaults.items():
        value = data.get(name, default)
        if default is not None and value is not None and not isinstance(value, type(default)) and not (isinstance(default, float) and isinstance(value, int)):
            raise StageError(f"{path}: {section}.{name} must be a {type(default).__name__}, got {value!r}")
        out[name] = value
    return out


def llm_namespace(path: Path, data: dict[str, Any]) -> SimpleNamespace:
    llm = SimpleNamespace(**_typed(path, "llm_config", data, LLM_DEFAULTS))
    if llm.num_key_value_heads in (0, None):
        llm.num_key_value_heads = llm.num_attention_heads
    llm.head_dim = llm.head_dim or llm.hidden_size // llm.num_attention_heads
    llm.moe_intermediate_size = llm.moe_intermediate_size or llm.intermediate_size
    if llm.num_attention_heads % llm.num_key_value_heads:
        raise StageError(f"{path}: llm_config.num_attention_heads ({llm.num_attention_heads}) is not a multiple of num_key_value_heads ({llm.num_key_value_heads})")
    if llm.rope_scaling is not None:
        raise StageError(f"{path}: llm_config.rope_scaling {llm.rope_scaling!r} is not supported (Ming-Lite-Omni's is null: plain RoPE)")
    if llm.num_experts is not None and llm.num_experts_per_tok > llm.num_experts:
        raise StageError(f"{path}: llm_config.num_experts_per_tok ({llm.num_experts_per_tok}) exceeds num_experts ({llm.num_experts})")
    return llm


def sanm_namespace(path: Path, data: dict[str, Any]) -> SimpleNamespace:
    sanm = SimpleNamespace(**_typed(path, "audio_config.audio_encoder_config_sanm", data, SANM_DEFAULTS))
    if sanm.input_layer != "pe" or sanm.selfattention_layer_type != "sanm" or sanm.tp_blocks or not sanm.normalize_before:
        raise StageError(
            f"{path}: audio_config.audio_encoder_config_sanm: only the release's SAN-M encoder is built here (input_layer 'pe', selfattention_layer_type 'sanm', normalize_before, no tp_blocks), got input_layer {sanm.input_layer!r}"
        )
    if sanm.output_size % sanm.attention_heads:
        raise StageError(f"{path}: audio_config.audio_encoder_config_sanm.output_size ({sanm.output_size}) is not a multiple of attention_heads ({sanm.attention_heads})")
    return sanm


def read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, f"a Ming-Lite-Omni folder holds {CONFIG}, model*.safetensors and the tokenizer")


def load_config(folder: Path) -> MingConfig:
    path = Path(folder) / CONFIG
    data = read_json(path)
    for section in ("llm_config", "vision_config"):
        if not isinstance(data.get(section), dict):
            raise StageError(f"{path}: {section} missing (Ming-Lite-Omni's config nests llm_config, vision_config and audio_config)")
    audio = sanm = None
    if data.get("audio_config"):
        if not isinstance(data["audio_config"], dict):
            raise StageError(f"{path}: audio_config must be an object")
        audio = SimpleNamespace(**_typed(path, "audio_config", data["audio_config"], AUDIO_DEFAULTS))
        if audio.ds_conv_type != "conv":
            raise StageError(f"{path}: audio_config.ds_conv_type {audio.ds_conv_type!r}: only 'conv' (the release's) is built here")
        sanm = sanm_namespace(path, data["audio_config"].get("audio_encoder_config_sanm") or {})
        if sanm.output_size != audio.audio_encoder_output_size:
            raise StageError(f"{path}: audio_config.audio_encoder_output_size ({audio.audio_encoder_output_size}) differs from audio_encoder_config_sanm.output_size ({sanm.output_size})")
    vision = data["vision_config"]
    missing = [k for k in ("depth", "hidden_size", "num_heads", "out_hidden_size", "intermediate_size") if k not in vision]
    if missing:
        raise StageError(f"{path}: vision_config.{missing[0]} missing")
    depth = data.get("mlp_depth", 1)
    if not isinstance(depth, int) or depth < 1:
        raise StageError(f"{path}: mlp_depth must be a positive int, got {depth!r}")
    return MingConfig(llm=llm_namespace(path, data["llm_config"]), vision=vision, audio=audio, sanm=sanm, mlp_depth=depth, has_talker=bool(data.get("talker_config")), raw=data)
