"""Tiny random-weight DeepSeek-VL2 checkpoints, built offline: how tests and the demo run.

``init:tiny`` / ``init:demo`` write what the public repository holds, small: ``config.json``
with the public fields (``vision_config`` in timm's terms, ``projector_config``,
``language_config`` with DeepSeek-V2's MoE fields, ``candidate_resolutions`` as multiples of
the view), ``model.safetensors`` in the public names (:mod:`.names`: fused SigLIP ``qkv``, one
tensor per expert), ``processor_config.json`` with the public processor's fields, and a
byte-level tokenizer with DeepSeek's special tokens, ``<image>`` and the ``deepseek`` chat format.

``tiny`` keeps the released geometry in small: a 5 x 5 patch grid (the released 27 x 27 is odd
too), padded to 6 x 6 by the projector, 3 x 3 tokens per view, and candidate resolutions up to
3 x 2 tiles of 35 pixels, so images are tiled. ``demo`` reads 56-pixel views (7 x 7 patches,
4 x 4 tokens) of the demo's 56-pixel images: one tile.
"""

from __future__ import annotations

import json
from pathlib import Path

from mmcore.engines import pick_preset

BOS, EOS, PAD, IMAGE = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<image>"
SPECIAL = [IMAGE, "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>", "<|User|>", "<|Assistant|>"]

# The public processor's ``deepseek`` conversation: "<|User|>: {question}\n\n<|Assistant|>:{answer}<eos>"
# after a leading bos; a system prompt first, followed by "\n\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}{% else %}{% set text = namespace(v='') %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}{% set text.v = text.v + '<image>\n' %}{% elif c['type'] == 'text' %}{% set text.v = text.v + c['text'] %}{% endif %}{% endfor %}"
    "{% set text = text.v %}{% endif %}"
    "{% if message['role'] == 'system' %}{{ text | trim }}{{ '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|User|>: ' + (text | trim) + '\n\n<|Assistant|>:' }}"
    "{% else %}{{ text | trim }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)

CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "red green blue yellow triangle square circle user assistant system image picture text word read describe",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# view/patch: the SigLIP input and patch; tiles: candidate resolutions as (across, down) of views
PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "vision": 32, "vision_layers": 2, "view": 35, "patch": 7, "tiles": [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (1, 3), (3, 2), (2, 3)], "mla": False},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "vision": 48, "vision_layers": 2, "view": 56, "patch": 8, "tiles": [(1, 1), (2, 1), (1, 2)], "mla": False},
    "tiny-mla": {"hidden": 64, "layers": 2, "heads": 4, "vision": 32, "vision_layers": 2, "view": 35, "patch": 7, "tiles": [(1, 1), (2, 1), (1, 2)], "mla": True},
    # DeepSeek-V3's router (sigmoid scores, noaux_tc choice among the best groups), as the larger VL2 configs route
    "tiny-sigmoid": {"hidden": 64, "layers": 2, "heads": 4, "vision": 32, "vision_layers": 2, "view": 35, "patch": 7, "tiles": [(1, 1), (2, 1), (1, 2)], "mla": True, "sigmoid": True},
}


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
        "routed_scaling_factor": 1.0,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": False,
        "scoring_func": "softmax",
        "use_mla": p["mla"],
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if p.get("sigmoid"):
        language.update(n_routed_experts=8, num_experts_per_tok=3, topk_method="noaux_tc", scoring_func="sigmoid", n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    if p["mla"]:
        language.update(q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    else:
        language.update(q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0)
    view = p["view"]
    return {
        "architectures": ["DeepseekVLV2ForCausalLM"],
        "model_type": "deepseek_vl_v2",
        "tile_tag": "2D",
        "global_view_pos": "head",
        "candidate_resolutions": [[a * view, d * view] for a, d in p["tiles"]],
        "vision_config": {
            "model_type": "vision",
            "model_name": "siglip_so400m_patch14_384",
            "image_size": view,
            "patch_size": p["patch"],
            "width": p["vision"],
            "layers": p["vision_layers"],
            "heads": 2,
            "mlp_ratio": 3.7362,
            "global_pool": "map",
            "ignore_head": True,
            "class_token": False,
            "num_classes": 0,
        },
        "projector_config": {"model_type": "mlp_projector", "projector_type": "downsample_mlp_gelu", "input_dim": p["vision"], "n_embed": hidden, "depth": 2, "mlp_ratio": 1, "downsample_ratio": 2},
        "language_config": language,
        "image_token_id": tokenizer.convert_tokens_to_ids(IMAGE),
        "torch_dtype": "float32",
    }


def save_public_layout(model, out: Path) -> None:  # type: ignore[no-untyped-def]
    """The model's weights in the public names (``model.safetensors``)."""
    from safetensors.torch import save_file

    from mmcore.engines import TensorInfo
    from mm_pack_deepseek_vl2.names import DeepseekVL2Names, built

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    plan = DeepseekVL2Names().to_hf({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in state.items()})
    save_file({k: built(r, state).contiguous() for k, r in plan.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (public layout, tokenizer, processor config) into ``out``."""
    import torch

    from mm_pack_deepseek_vl2.model import DeepseekVL2Config, DeepseekVL2ForCausalLM

    tokenizer = build_tokenizer()
    fields = public_config(preset, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(fields, indent=2))
    torch.manual_seed(seed)
    model = DeepseekVL2ForCausalLM(DeepseekVL2Config.from_pretrained(out))
    for name, bias in model.named_buffers():
        if name.endswith("e_score_correction_bias"):  # zeros at init; a trained one is not
            bias.copy_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(seed)) * 0.1)
    save_public_layout(model, out)
    tokenizer.save_pretrained(out)
    p = pick_preset(PRESETS, preset)
    processor = {
        "processor_class": "DeepseekVLV2Processor",
        "candidate_resolutions": fields["candidate_resolutions"],
        "patch_size": p["patch"],
        "downsample_ratio": 2,
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
