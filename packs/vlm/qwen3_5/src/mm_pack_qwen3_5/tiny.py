"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny`` (dense), ``init:tiny-moe`` (4 experts, 2 per token, a shared expert) and ``init:demo`` write a folder that ``from_pretrained`` loads: config (the real
config's fields, hybrid layers included: Gated DeltaNet then full attention), safetensors
weights, a tiny ``Qwen3_5Tokenizer`` (:mod:`mm_qwen_vision.tiny`), the image processor and the
chat template.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset
from mm_qwen_vision.tiny import build_tokenizer

# layers: with full_attention_interval 2, layer 0 is linear attention (Gated DeltaNet), layer 1 full attention
PRESETS = {
    "tiny": {"moe": False, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32},
    "tiny-moe": {"moe": True, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32},
    "demo": {"moe": False, "hidden": 96, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 48},
}


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    """The transformers config of a tiny preset, its token ids taken from ``tokenizer``."""
    p = pick_preset(PRESETS, preset)
    ids = {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in [
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        ]
    }
    head_dim = 2 * p["hidden"] // p["heads"]  # as the released models: head_dim > hidden / heads
    rotary_half = head_dim // 8  # partial_rotary_factor 0.25: a quarter of each head rotates; sections sum to half of that
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        layer_types=["linear_attention" if (i + 1) % 2 else "full_attention" for i in range(p["layers"])],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=head_dim,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [rotary_half - 2 * (rotary_half // 4), rotary_half // 4, rotary_half // 4],
            "mrope_interleaved": True,
        },
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    vision = dict(
        depth=p["vision_depth"],
        hidden_size=p["vision_dim"],
        intermediate_size=2 * p["vision_dim"],
        num_heads=2,
        out_hidden_size=p["hidden"],
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=64,  # 8 x 8 learned positions, resampled per image
    )
    if p["moe"]:
        from transformers import Qwen3_5MoeConfig

        text.pop("intermediate_size")
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=p["hidden"] // 4, shared_expert_intermediate_size=p["hidden"] // 2, router_aux_loss_coef=0.01)
        return Qwen3_5MoeConfig(text_config=text, vision_config=vision, **ids)
    from transformers import Qwen3_5Config

    return Qwen3_5Config(text_config=text, vision_config=vision, **ids)


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, image processor) into ``out``."""
    import torch
    from transformers.utils import logging as hf_logging

    from mm_qwen_vision import image_processor
    from mm_qwen_vision.qwen3vl_processor import CHAT_TEMPLATE
    from mm_pack_qwen3_5.family import MEAN_STD, PATCH, model_class

    hf_logging.disable_progress_bar()  # a bar for a one-shard save of a tiny model is noise
    tokenizer = build_tokenizer(tokenizer_class="Qwen3_5Tokenizer")
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = model_class(config)(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    image_processor(patch_size=PATCH, mean_std=MEAN_STD).save_pretrained(out)
