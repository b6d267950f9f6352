"""Tiny random BAGEL checkpoints in the release's folder layout, built offline from config.

``init:tiny`` / ``init:demo`` write what ``ByteDance-Seed/BAGEL-7B-MoT`` holds: ``llm_config.json``
(a Qwen2.5 config with the release's fields), ``vit_config.json`` (SigLIP's, one layer more than
the tower uses, as the release's loader drops one), ``config.json`` (BagelConfig's fields),
``ema.safetensors`` (bfloat16, the reference module's names), ``ae.safetensors`` (a FLUX-shaped
autoencoder in BFL's names, float32 as FLUX's file) and a byte-level tokenizer carrying Qwen2's
chat words (``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|vision_end|>``).

``init:demo``'s autoencoder is not random: a random one cannot reconstruct, so what the demo
draws would decode to static. It is fitted to the demo's kind of pictures
(:func:`mmcore.engines.train_demo_vae`, seeded) and its latents' spread folded into its weights
(:func:`fold_latent_scale`: the release's file has no config, FLUX's scale and shift are
constants), and ``demo_vae.json`` beside it states its held-out reconstruction PSNR.

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
# latent_size: max_latent_size (latent tokens per side); demo_vae: (steps, lr) of the fitted VAE;
# timestep_shift: config.json's training shift (the reference's default is 1.0): the demo trains
# at the sampler's 3.0, where a picture's layout is decided (measured, seed 10 AVX2: shape
# agreement 0.30 at 1.0, 0.65 at 3.0)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv": 2, "vit": 32, "vit_layers": 2, "vit_patch": 4, "vit_side": 8, "vae": [32, 32], "z": 4, "latent_size": 8},
    "demo": {
        "hidden": 96,
        "layers": 2,
        "heads": 4,
        "kv": 2,
        "vit": 48,
        "vit_layers": 2,
        "vit_patch": 4,
        "vit_side": 8,
        "vae": [32, 32],
        "z": 4,
        "latent_size": 8,
        "demo_vae": (400, 3e-3),
        "timestep_shift": 3.0,
    },
}

#: the demo VAE's posterior std, in units of its normalised latents' spread (:func:`fold_latent_scale`)
POSTERIOR_STD = 0.05

#: the demo's pictures (:func:`mm_pack_bagel.data.write_demo` draws its samples so)
PICTURE_SIZE, PICTURE_RADIUS = 32, (9, 13)


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
    extra = {"max_latent_size": p["latent_size"], "vit_max_num_patch_per_side": p["vit_side"], **({"timestep_shift": p["timestep_shift"]} if "timestep_shift" in p else {})}
    return llm, vit, extra


def build_vae(preset: str):  # type: ignore[no-untyped-def]
    from diffusers import AutoencoderKL

    from mm_pack_bagel.vae import diffusers_config

    p = pick_preset(PRESETS, preset)
    shape = {"block_out_channels": p["vae"], "layers_per_block": 1, "z_channels": p["z"], "downsample": 2 ** (len(p["vae"]) - 1), "in_channels": 3}
    return AutoencoderKL(**diffusers_config(shape))


def demo_pictures(count: int, seed: int) -> list:  # type: ignore[type-arg]
    """``count`` pictures drawn as the demo's samples are, uint8 ``[1, H, W, 3]`` each (no files)."""
    import random

    import numpy as np

    from mmcore.data import COLOURS, SHAPES, shape_image

    rng = random.Random(seed)
    return [np.asarray(shape_image(rng.choice(SHAPES), COLOURS[rng.choice(sorted(COLOURS))], rng, size=PICTURE_SIZE, radius=PICTURE_RADIUS))[None] for _ in range(count)]


def fit_demo_vae(vae, seed: int, steps: int, lr: float) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Fit ``vae`` to reconstruct the demo's pictures (96 drawn from ``seed + 1000``; the PSNR on
    16 others from ``seed + 2000``), then fold its latents' spread into it; returns what
    :func:`mmcore.engines.train_demo_vae` measured, with the fold's figures."""
    from mmcore.engines import train_demo_vae

    measured = train_demo_vae(vae, demo_pictures(96, seed + 1_000), demo_pictures(16, seed + 2_000), steps=steps, lr=lr, batch=8, seed=seed)
    return {**measured, **fold_latent_scale(vae)}


def fold_latent_scale(vae) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Rescale ``vae``'s latent space so FLUX's constant normalisation ``(z - 0.1159) * 0.3611``
    (BAGEL's ``load_ae`` hard-codes it; ``ae.safetensors`` has no config to carry another) gives
    its latents unit spread: ``z' = a z`` with ``a`` from the spread
    :func:`mmcore.engines.set_latent_normalisation` measured (``1 / scaling_factor``). The
    encoder's mean channels are multiplied by ``a`` and the decoder's first convolution divided
    by it: the posterior mode's decoding unchanged (exact up to rounding), as both are linear
    and the zero padding stays zero. The mean is not folded (the decoder's zero-padded first
    convolution would see it at the borders); the normalised latents' mean is returned.

    The posterior's spread is set to ``POSTERIOR_STD`` of the normalised latents' unit spread:
    the fit decodes the posterior's mode, so nothing trains its variance but the KL term, which
    pulls it to one, about the latents' own spread. Preprocess stores the posterior and training
    draws from it, as the reference does; with that spread the drawn latents would be mostly
    noise the decoder never saw (measured: a posterior std of 0.81 of the latents' spread, and
    pictures drawn as speckled blobs). A released autoencoder's posterior is narrow."""
    import math

    import torch

    from mm_pack_bagel.vae import SCALE, SHIFT

    spread, mean = 1.0 / vae.config.scaling_factor, vae.config.shift_factor
    a = 1.0 / (spread * SCALE)
    z = vae.config.latent_channels
    with torch.no_grad():
        out = vae.encoder.conv_out
        out.weight[:z] *= a
        out.bias[:z] *= a
        out.weight[z:] = 0.0
        out.bias[z:] = 2 * math.log(POSTERIOR_STD / SCALE)
        vae.decoder.conv_in.weight /= a
    vae.register_to_config(scaling_factor=SCALE, shift_factor=SHIFT)
    return {"latent_scale_folded": round(a, 5), "posterior_std": POSTERIOR_STD, "normalised_latents_mean": round((a * mean - SHIFT) * SCALE, 4)}


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight BAGEL folder of ``preset`` into ``out`` (``demo``: its VAE fitted, ``demo_vae.json`` beside it)."""
    import torch

    from mm_pack_bagel.checkpoint import write_folder
    from mm_pack_bagel.config import BagelConfig, DEFAULTS, llm_config, vit_config
    from mm_pack_bagel.model import Bagel

    p = pick_preset(PRESETS, preset)
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
    measured = fit_demo_vae(vae, seed, *p["demo_vae"]) if p.get("demo_vae") else None
    write_folder(model, vae, tokenizer, Path(out), llm, vit, extra)
    if measured is not None:
        from mmcore.engines import write_demo_vae_report

        write_demo_vae_report(Path(out), measured)
