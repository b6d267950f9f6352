"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny``, ``init:tiny-moe`` (GLM-4.5V) and ``init:demo`` write a folder that ``from_pretrained`` loads: config,
safetensors weights, a small byte-level BPE tokenizer with GLM's special tokens, the image
processor and the chat template.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

SPECIAL_TOKENS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]

# Words the tiny tokenizer learns whole: the demo's vocabulary plus common chat text.
CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "The shape is red. The shape is green. The shape is blue. The shape is yellow.",
    "red green blue yellow triangle square circle user assistant system image video picture 0 1 2 3 4 5 6 7 8 9",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32},
    "tiny-moe": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32, "moe": True},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 48},
}


def build_tokenizer(vocab_size: int = 384):  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer with GLM's special tokens (the real one is GLM's own BPE)."""
    from transformers import Qwen2Tokenizer

    from mmcore.engines import train_byte_level_bpe

    vocab, merges = train_byte_level_bpe(CORPUS, vocab_size)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens(["<|endoftext|>"], special_tokens=True)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    from transformers import Glm4vConfig, Glm4vMoeConfig

    p = pick_preset(PRESETS, preset)
    ids = tokenizer.convert_tokens_to_ids
    head_dim = p["hidden"] // p["heads"]
    quarter = head_dim // 4  # GLM rotates half of each head; the M-RoPE sections (t, h, w) sum to a quarter
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [quarter - 2 * (quarter // 4), quarter // 4, quarter // 4], "partial_rotary_factor": 0.5},
        eos_token_id=ids("<|endoftext|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    vision = dict(
        depth=p["vision_depth"],
        hidden_size=p["vision_dim"],
        out_hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        image_size=56,
    )
    if p.get("moe"):  # GLM-4.5V: the first layer dense, then 4 routed experts (2 per token) and a shared one
        text.update(
            head_dim=head_dim,
            moe_intermediate_size=p["hidden"] // 4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            router_aux_loss_coef=0.01,
        )
    config_class = Glm4vMoeConfig if p.get("moe") else Glm4vConfig
    return config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image|>"),
        video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"),
        image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"),
        video_end_token_id=ids("<|end_of_video|>"),
    )


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, image processor) into ``out``."""
    import torch
    from transformers.utils import logging as hf_logging

    from mm_pack_glm4v.data import CHAT_TEMPLATE, image_processor
    from mm_pack_glm4v.family import model_class

    hf_logging.disable_progress_bar()  # a bar for a one-shard save of a tiny model is noise
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = model_class(config)(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    image_processor(56 * 56, 512 * 28 * 28).save_pretrained(out)
