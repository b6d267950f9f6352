"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny`` (Qwen2-VL) and ``init:tiny-2.5`` (Qwen2.5-VL) write a folder that
``from_pretrained`` loads: config, safetensors weights, a small byte-level BPE tokenizer with
the Qwen special tokens, the image processor and the chat template.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset
from mm_qwen_vision.tiny import build_tokenizer

PRESETS = {
    "tiny": {"family": "qwen2_vl", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32},
    "tiny-2.5": {"family": "qwen2_5_vl", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32},
    "demo": {"family": "qwen2_vl", "hidden": 96, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 48},
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
    head_dim = p["hidden"] // p["heads"]
    half = head_dim // 2  # mrope sections (temporal, height, width) sum to head_dim / 2
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [half - 2 * (half // 3), half // 3, half // 3]},
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    if p["family"] == "qwen2_vl":
        from transformers import Qwen2VLConfig

        vision = dict(depth=p["vision_depth"], embed_dim=p["vision_dim"], hidden_size=p["hidden"], num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
        return Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
    from transformers import Qwen2_5_VLConfig

    vision = dict(
        depth=p["vision_depth"],
        hidden_size=p["vision_dim"],
        out_hidden_size=p["hidden"],
        intermediate_size=2 * p["vision_dim"],
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=56,
        fullatt_block_indexes=[p["vision_depth"] - 1],
    )
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, processor) into ``out``."""
    import torch

    from mm_pack_qwen2vl.data import CHAT_TEMPLATE, image_processor
    from mm_pack_qwen2vl.family import model_class

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar for a one-shard save of a tiny model is noise
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = model_class(config)(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    image_processor().save_pretrained(out)
