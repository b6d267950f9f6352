"""Tiny random BAGEL checkpoints in the release's folder layout, built offline from config.

``init:tiny`` / ``init:demo`` write what ``ByteDance-Seed/BAGEL-7B-MoT`` holds: ``llm_config.json``
(a Qwen2.5 config with the release's fields), ``vit_config.json`` (SigLIP's, one layer more than
the tower uses, as the release's loader drops one), ``config.json`` (BagelConfig's fields),
``ema.safetensors`` (bfloat16, the reference module's names), ``ae.safetensors`` (a FLUX-shaped
autoencoder in BFL's names, float32 as FLUX's file) and a byte-level tokenizer carrying Qwen2's
chat words (``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|vision_end|>``).

The release's sizes, for reference: LLM hidden 3584, 28 layers, 28 heads / 4 KV heads, vocab
152064, RoPE base 1e6; ViT so400m (1152 wide, 27 layers in the file, 16 heads, 14-pixel patches,
980-pixel table: 70 per side); VAE 128-256-512-512 channels, 16 latent channels, 8x down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.engines import pick_preset

BOS, EOS, SOI, EOI, PAD = "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|endoftext|>"

CORPUS = [
    "What colour is the shape? The shape is red. The shape is green. The shape is blue. The shape is yellow.",
    "a red square a blue circle a green triangle a yellow square user assistant system picture image",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# hidden/layers/heads/kv: the decoder; vit*: the tower (vit_side: position table per side,
# image = vit_side * vit_patch); vae: the autoencoder's block channels (GroupNorm needs 32s);
# latent_size: max_latent_size (latent tokens per side)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv": 2, "vit": 32, "vit_layers": 2, "vit_patch": 4, "vit_side": 8, "vae": [32, 32], "z": 4, "latent_size": 8},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "kv": 2, "vit": 48, "vit_layers": 2, "vit_patch": 4, "vit_side": 8, "vae": [32, 32], "z": 4, "latent_size": 8},
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    from mmcore.engines import byte_level_tokenizer

    return byte_level_tokenizer(CORPUS, [BOS, EOS, SOI, EOI], vocab_size=320, eos=EOS, pad=PAD)


def token_ids(tokenizer) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The four ids packing needs, as the reference's ``add_special_tokens`` names them."""
    from mmcore.errors import StageError

    names = {"bos": BOS, "eos": EOS, "soi": SOI, "eoi": EOI}
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in names.items()}
    missing = [names[k] for k, i in ids.items() if i is None or (i == tokenizer.unk_token_id and tokenizer.unk_token != names[k])]
    if missing:
        raise StageError(f"the tokenizer has no {missing[0]} token (BAGEL's text and image items need {', '.join(names.values())})")
    return ids


def config_dicts(preset: str, vocab: int) -> tuple[dict, dict, dict]:
    """(llm_config.json, vit_config.json, config.json) of a preset, in the release's fields."""
    p = pick_preset(PRESETS, preset)
    llm = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": p["hidden"],
        "intermediate_size": 2 * p["hidden"],
        "num_hidden_layers": p["layers"],
        "num_attention_heads": p["heads"],
        "num_key_value_heads": p["kv"],
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 1024,
        "max_window_layers": p["layers"],
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    }
    vit = {
        "model_type": "siglip_vision_model",
        "hidden_size": p["vit"],
        "intermediate_size": 2 * p["vit"],
        "num_hidden_layers": p["vit_layers"] + 1,
        "num_attention_heads": 2,
        "num_channels": 3,
        "image_size": p["vit_side"] * p["vit_patch"],
        "patch_size": p["vit_patch"],
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "attention_dropout": 0.0,
    }
    extra = {"max_latent_size": p["latent_size"], "vit_max_num_patch_per_side": p["vit_side"]}
    return llm, vit, extra


def build_vae(preset: str):  # type: ignore[no-untyped-def]
    from diffusers import AutoencoderKL

    from mm_pack_bagel.vae import diffusers_config

    p = pick_preset(PRESETS, preset)
    shape = {"block_out_channels": p["vae"], "layers_per_block": 1, "z_channels": p["z"], "downsample": 2 ** (len(p["vae"]) - 1), "in_channels": 3}
    return AutoencoderKL(**diffusers_config(shape))


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight BAGEL folder of ``preset`` into ``out``."""
    import torch

    from mm_pack_bagel.checkpoint import write_folder
    from mm_pack_bagel.config import BagelConfig, DEFAULTS, llm_config, vit_config
    from mm_pack_bagel.model import Bagel

    tokenizer = build_tokenizer()
    llm, vit, extra = config_dicts(preset, len(tokenizer))
    torch.manual_seed(seed)
    vae = build_vae(preset)
    shape = {"z_channels": vae.config.latent_channels, "downsample": 2 ** (len(vae.config.block_out_channels) - 1)}
    model = Bagel(BagelConfig(llm=llm_config(llm), vit=vit_config(vit), vae=shape, **{**DEFAULTS, **extra}))
    with torch.no_grad():
        # every trainable tensor random (the reference zero-initialises llm2vae, which would make
        # a tiny model's velocity, and any check of it, trivially zero); norms' gains near one
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            param.normal_(0.0, 0.02)
            if "norm" in name and name.endswith("weight"):
                param.add_(1.0)
    write_folder(model, vae, tokenizer, Path(out), llm, vit, extra)
