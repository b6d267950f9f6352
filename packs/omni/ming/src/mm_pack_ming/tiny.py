"""Tiny random Ming-Lite-Omni checkpoints in the release's folder layout, built offline.

``init:tiny`` / ``init:demo`` write what ``inclusionAI/Ming-Lite-Omni`` holds for the
understanding side: ``config.json`` with the release's nested fields (:data:`RELEASE` below,
sizes shrunk), two ``model-0000i-of-00002.safetensors`` shards in bfloat16 with
``model.safetensors.index.json``, and a byte-level tokenizer carrying the release's special
tokens (``<role>``, ``</role>``, ``<image>``, ``<imagePatch>``, ``</image>``, ``<audio>``,
``<audioPatch>``, ``</audio>``, ``<|endoftext|>``), whose ids go into ``llm_config``.

The release's sizes, for reference: decoder hidden 2048, 28 layers, 16 heads / 4 KV heads,
64 experts of width 1408 + 2 shared, top 6, vocab 126464, RoPE base 600000; vision 32 blocks
of 1280 (window 112, full attention at 7/15/23/31), merged to 8192; SAN-M 50 blocks of 512.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from mmcore.engines import pick_preset

ROLE, ROLE_END, EOS = "<role>", "</role>", "<|endoftext|>"
IMAGE, IMAGE_PATCH, IMAGE_END = "<image>", "<imagePatch>", "</image>"
AUDIO, AUDIO_PATCH, AUDIO_END = "<audio>", "<audioPatch>", "</audio>"
SPECIALS = [ROLE, ROLE_END, IMAGE, IMAGE_PATCH, IMAGE_END, AUDIO, AUDIO_PATCH, AUDIO_END]

CORPUS = [
    "<role>HUMAN</role>What colour is the shape?<role>ASSISTANT</role>The shape is red. The shape is green. The shape is blue. The shape is yellow.",
    "a red square a blue circle a green triangle a yellow square HUMAN ASSISTANT picture image audio tone high low",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# The release's config.json, less the vision config's generic PretrainedConfig fields.
RELEASE: dict[str, Any] = {
    "architectures": ["BailingMMNativeForConditionalGeneration"],
    "audio_config": {
        "audio_encoder_output_size": 512,
        "ds_conv_type": "conv",
        "ds_kernel_size": 1,
        "ds_stride": 1,
        "audio_encoder_config_sanm": {
            "input_size": 560,
            "output_size": 512,
            "attention_heads": 4,
            "linear_units": 2048,
            "num_blocks": 50,
            "dropout_rate": 0.1,
            "positional_dropout_rate": 0.1,
            "attention_dropout_rate": 0.1,
            "input_layer": "pe",
            "pos_enc_class": "SinusoidalPositionEncoder",
            "normalize_before": True,
            "kernel_size": 11,
            "sanm_shfit": 0,
            "selfattention_layer_type": "sanm",
        },
    },
    "llm_config": {
        "architectures": ["BailingMoeForCausalLM"],
        "attention_dropout": 0.0,
        "eos_token_id": 126081,
        "pad_token_id": 126081,
        "first_k_dense_replace": 0,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.006,
        "intermediate_size": 5632,
        "image_patch_token": 126346,
        "max_position_embeddings": 32768,
        "model_type": "bailing_moe",
        "moe_intermediate_size": 1408,
        "multi_gate": True,
        "num_experts": 64,
        "num_shared_experts": 2,
        "norm_topk_prob": True,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 600000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_bias": False,
        "use_qkv_bias": False,
        "vocab_size": 126464,
        "embedding_dropout": 0.0,
        "norm_head": True,
        "norm_softmax": False,
        "output_dropout": 0.0,
        "output_router_logits": False,
    },
    "mlp_depth": 2,
    "model_type": "bailingmm",
    "torch_dtype": "float32",
    "vision_config": {
        "architectures": ["Qwen2_5_VisionTransformer"],
        "depth": 32,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "hidden_act": "silu",
        "hidden_size": 1280,
        "in_channels": 3,
        "in_chans": 3,
        "intermediate_size": 3456,
        "model_type": "qwen2_5_vit",
        "num_heads": 16,
        "out_hidden_size": 8192,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
        "tokens_per_second": 2,
        "window_size": 112,
    },
}

# llm: hidden, layers, heads, kv, experts, top_k, shared, expert width; vit: hidden, depth,
# heads, patch, out (merged width); sanm: width, blocks, heads
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv": 2,
        "experts": 4,
        "top_k": 2,
        "shared": 1,
        "expert": 32,
        "vit": 32,
        "vit_depth": 2,
        "vit_heads": 2,
        "patch": 4,
        "out": 64,
        "sanm": 32,
        "sanm_blocks": 2,
        "sanm_heads": 2,
    },
    "demo": {
        "hidden": 96,
        "layers": 2,
        "heads": 4,
        "kv": 2,
        "experts": 4,
        "top_k": 2,
        "shared": 1,
        "expert": 64,
        "vit": 48,
        "vit_depth": 2,
        "vit_heads": 2,
        "patch": 4,
        "out": 96,
        "sanm": 32,
        "sanm_blocks": 2,
        "sanm_heads": 2,
    },
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    from mmcore.engines import byte_level_tokenizer

    return byte_level_tokenizer(CORPUS, SPECIALS, vocab_size=320, eos=EOS, pad=EOS)


def config_dict(preset: str, tokenizer) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The release's ``config.json`` with a preset's sizes and the tokenizer's ids."""
    p = pick_preset(PRESETS, preset)
    c = copy.deepcopy(RELEASE)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    c["llm_config"].update(
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv"],
        num_experts=p["experts"],
        num_experts_per_tok=p["top_k"],
        num_shared_experts=p["shared"],
        moe_intermediate_size=p["expert"],
        vocab_size=len(tokenizer),
        eos_token_id=eos,
        pad_token_id=eos,
        image_patch_token=tokenizer.convert_tokens_to_ids(IMAGE_PATCH),
        max_position_embeddings=4096,
    )
    c["vision_config"].update(
        depth=p["vit_depth"],
        hidden_size=p["vit"],
        intermediate_size=2 * p["vit"],
        num_heads=p["vit_heads"],
        patch_size=p["patch"],
        spatial_patch_size=p["patch"],
        out_hidden_size=p["out"],
        window_size=4 * p["patch"],  # two merged patches a side: windows smaller than a 32-pixel picture
        fullatt_block_indexes=[p["vit_depth"] - 1],
    )
    sanm = c["audio_config"]["audio_encoder_config_sanm"]
    sanm.update(output_size=p["sanm"], attention_heads=p["sanm_heads"], linear_units=2 * p["sanm"], num_blocks=p["sanm_blocks"])
    c["audio_config"]["audio_encoder_output_size"] = p["sanm"]
    return c


NORMS = ("norm.weight", "layernorm.weight", "norm1.weight", "norm2.weight", "ln_q.weight")
ROUTERS = ("mlp.gate.weight", "mlp.image_gate.weight", "mlp.audio_gate.weight")


def randomise(model) -> None:  # type: ignore[no-untyped-def]
    """Every tensor random at a scale that keeps activations near one (matrices 1/sqrt(fan-in),
    the embedding table 1), norms' gains near one, routers spread so that top-k choices differ
    between tokens: then every part, each expert and each router included, moves the logits,
    and no check of them is trivially small."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 1.0 if name.endswith("word_embeddings.weight") else param[0].numel() ** -0.5)
            else:
                param.normal_(0.0, 0.02)
            if name.endswith(NORMS):
                param.add_(1.0)
            if name.endswith(ROUTERS):
                param.mul_(4.0)


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight Ming-Lite-Omni folder of ``preset`` into ``out``."""
    import torch

    from mm_pack_ming.checkpoint import write_folder
    from mm_pack_ming.config import load_config
    from mm_pack_ming.model import MingOmni

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = config_dict(preset, tokenizer)
    (out / "config.json").write_text(json.dumps(config))  # the model is built from the folder's config
    torch.manual_seed(seed)
    model = MingOmni(load_config(out))
    randomise(model)
    write_folder(model, config, out)
    tokenizer.save_pretrained(out)
