"""Tiny random-weight DeepSeek-OCR checkpoints, built offline: how tests and the demo run.

``init:tiny`` / ``init:demo`` write what the public repository holds, small: ``config.json``
with the public fields (``vision_config.width`` with ``sam_vit_b`` and ``clip-l-14-224``,
``projector_config``, ``language_config`` with DeepSeek-V2's MoE fields, repeated at the top
level as the release does), ``model.safetensors`` in the public names (:mod:`.names`: SAM's
``blocks``/``neck.<i>``/``net_2``/``net_3``, CLIP's fused ``qkv_proj``, one tensor per expert),
``processor_config.json`` with the public processor's fields, and a byte-level tokenizer with
DeepSeek's special tokens, ``<image>`` and the reference's plain ``<|User|>``/``<|Assistant|>`` format.

The released geometry in small: the SAM reads 4-pixel patches (the release: 16) with 4-cell
windows, one global layer, then the neck and the two stride-2 convolutions; the CLIP's position
table is 4 x 4 (+1), so a 64-pixel view (the release's 1024: 16 x 16 tokens) needs no resizing
and a 40-pixel tile (the release's 640) is resized to 3 x 3, as the release resizes 16 to 10.
The extra SAM fields (``patch_size``, ``window_size``, ``out_chans``) are what the release fixes
in code (16, 14, 256); a folder without them reads those.
"""

from __future__ import annotations

import json
from pathlib import Path

from mmcore.engines import pick_preset

BOS, EOS, PAD, IMAGE = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<image>"
SPECIAL = [IMAGE, "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>", "<|User|>", "<|Assistant|>"]

# The reference's conversation: its ``plain`` format with an empty system prompt
# ("<|User|>"-less: the prompt as written, "<image>\n" before the question); answers close with eos.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}{% else %}{% set text = namespace(v='') %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}{% set text.v = text.v + '<image>\n' %}{% elif c['type'] == 'text' %}{% set text.v = text.v + c['text'] %}{% endif %}{% endfor %}"
    "{% set text = text.v %}{% endif %}"
    "{% if message['role'] == 'system' %}{{ text }}{{ '\n' }}"
    "{% elif message['role'] == 'user' %}{{ text }}"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)

CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "red green blue yellow triangle square circle Free OCR. Convert the document to markdown. Describe this image in detail.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# SAM 4-pixel patches: base/tile are the data section's image sizes the preset runs at
PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "sam": 32, "clip": 32, "mla": False},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "sam": 32, "clip": 48, "mla": False},
    "tiny-mla": {"hidden": 64, "layers": 2, "heads": 4, "sam": 32, "clip": 32, "mla": True},
}
SAM_PATCH, VIEW = 4, 64  # VIEW: the SAM's pretraining size (64 / 4 = 16 cells a side, 4 x 4 after the convolutions)


def build_tokenizer():  # type: ignore[no-untyped-def]
    from mmcore.engines import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(CORPUS, SPECIAL, vocab_size=384, eos=EOS, pad=PAD, bos=BOS, chat_template=CHAT_TEMPLATE)
    tokenizer.add_bos_token = False  # the template writes it
    return tokenizer


def public_config(preset: str, tokenizer) -> dict:  # type: ignore[no-untyped-def]
    """The public ``config.json`` fields of a tiny preset."""
    p = pick_preset(PRESETS, preset)
    hidden = p["hidden"]
    language = {
        "model_type": "deepseek_v2",
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "moe_intermediate_size": hidden // 2,
        "num_hidden_layers": p["layers"],
        "num_attention_heads": p["heads"],
        "num_key_value_heads": p["heads"],
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "use_mla": p["mla"],
        "max_position_embeddings": 4096,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "lm_head": True,
        "rm_head": False,
    }
    if p["mla"]:
        language.update(q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    else:
        language.update(q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0)
    sam = {"width": p["sam"], "layers": 2, "heads": 2, "global_attn_indexes": [1], "downsample_channels": [24, p["clip"]], "patch_size": SAM_PATCH, "window_size": 4, "out_chans": 16}
    return {
        "architectures": ["DeepseekOCRForCausalLM"],
        "model_type": "deepseek_vl_v2",
        "candidate_resolutions": [[VIEW, VIEW]],
        "global_view_pos": "head",
        "tile_tag": "2D",
        "vision_config": {
            "model_type": "vision",
            "model_name": "deeplip_b_l",
            "image_size": VIEW,
            "mlp_ratio": 3.7362,
            "width": {"clip-l-14-224": {"heads": 2, "image_size": 56, "layers": 2, "patch_size": 14, "width": p["clip"]}, "sam_vit_b": sam},
        },
        "projector_config": {"model_type": "mlp_projector", "projector_type": "linear", "input_dim": 2 * p["clip"], "n_embed": hidden},
        "language_config": language,
        **{k: v for k, v in language.items() if k != "model_type"},  # the release repeats them at the top level
        "image_token_id": tokenizer.convert_tokens_to_ids(IMAGE),
        "torch_dtype": "float32",
    }


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (public layout, tokenizer, processor config) into ``out``."""
    import torch

    from mm_pack_deepseek_ocr.model import DeepseekOcrConfig, DeepseekOcrForCausalLM
    from mm_pack_deepseek_ocr.names import save_public

    tokenizer = build_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(public_config(preset, tokenizer), indent=2))
    torch.manual_seed(seed)
    model = DeepseekOcrForCausalLM(DeepseekOcrConfig.from_pretrained(out))
    with torch.no_grad():  # SAM's zero-initialised positions would leave the tiny tower blind to place
        for name, param in model.named_parameters():
            if name.endswith(("pos_embed", "rel_pos_h", "rel_pos_w")):
                param.normal_(std=0.02)
    save_public(model, out)
    tokenizer.save_pretrained(out)
    processor = {
        "processor_class": "DeepseekVLV2Processor",
        "candidate_resolutions": [[VIEW, VIEW]],
        "patch_size": SAM_PATCH,
        "downsample_ratio": 4,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "normalize": True,
        "image_token": IMAGE,
        "pad_token": PAD,
        "add_special_token": False,
        "sft_format": "deepseek",
        "mask_prompt": False,
        "ignore_id": -100,
    }
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))
