"""Tiny random-weight Open-Sora Plan pipelines built from config (how tests and the demo run offline).

``init:tiny`` writes the folder ``OpenSoraPlanPipeline.from_pretrained`` loads: ``transformer/``
(the sparse U-MMDiT, the public config fields), ``vae/``, ``text_encoder/`` (T5) +
``tokenizer/``, ``text_encoder_2/`` (CLIP with projection) + ``tokenizer_2/``, ``scheduler/``.

The VAE of ``init:tiny`` and ``init:demo`` is diffusers' ``AutoencoderKLWan`` (the demo's: trained
at ``init:demo`` to reconstruct moving-shape clips); ``init:tiny-wfvae`` has a tiny random WF-VAE
(:mod:`mm_pack_opensoraplan.wfvae`, Open-Sora Plan's own VAE: 8x in time and space, clips of 8k + 1
frames) written in the released layout (``vae/config.json`` + ``vae/checkpoint.ckpt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.engines import pick_preset

CORPUS = [
    *(f"a {c} {s} moves {m}" for c in ("red", "green", "blue") for s in ("square", "circle") for m in ("left", "right", "up", "down")),
    "a yellow triangle",
    "video of a cat, slow motion, bright light, white background",
]

PRESETS = {
    "tiny": {"heads": 2, "head_dim": 16, "layers": [2, 2, 2], "sparse_n": [1, 2, 1]},
    # the demo's: 4x4 patches of 8x8 latents a frame, 3 latent frames; the middle stage sparse (2 groups)
    "tiny-wfvae": {"heads": 2, "head_dim": 16, "layers": [2, 2, 2], "sparse_n": [1, 2, 1], "wfvae": True},
    "demo": {"heads": 4, "head_dim": 16, "layers": [2, 2, 2], "sparse_n": [1, 2, 1], "demo_vae": True},
}


def transformer(p: dict[str, Any], channels: int, text_dim: int, pooled_dim: int) -> Any:
    from mm_pack_opensoraplan.transformer import OpenSoraPlanTransformer3DModel

    return OpenSoraPlanTransformer3DModel(
        num_heads=p["heads"],
        head_dim=p["head_dim"],
        in_channels=channels,
        out_channels=channels,
        num_layers=p["layers"],
        sparse_n=p["sparse_n"],
        caption_channels=text_dim,
        pooled_projection_dim=pooled_dim,
        timestep_embed_dim=32,
    )


def frozen_parts(p: dict[str, Any], seed: int) -> dict[str, Any]:
    """The seeded tokenizers, T5, CLIP, VAE and scheduler (built before the transformer)."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler
    from diffusers.utils import logging as diffusers_logging
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel
    from transformers.utils import logging as hf_logging

    from mmcore.engines import clip_tokenizer, unigram_tokenizer

    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = unigram_tokenizer(CORPUS), clip_tokenizer(CORPUS)
    t5 = T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    clip = CLIPTextConfig(
        vocab_size=len(tokenizer_2),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=77,
        projection_dim=32,
        pad_token_id=tokenizer_2.pad_token_id,
        bos_token_id=tokenizer_2.bos_token_id,
        eos_token_id=tokenizer_2.eos_token_id,
    )
    text_encoder, text_encoder_2 = T5EncoderModel(t5).eval(), CLIPTextModelWithProjection(clip).eval()
    measured = None
    if p.get("wfvae"):
        vae = tiny_wfvae()
    elif p.get("demo_vae"):  # 4x in space and time, residual; trained to reconstruct the demo's clips
        vae, measured = train_vae(seed)
    else:
        vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True]).eval()
    parts = {
        "vae": vae.eval(),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "text_encoder_2": text_encoder_2,
        "tokenizer_2": tokenizer_2,
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),  # the reference's inference shift
    }
    return {**parts, "measured": measured}


#: the demo VAE's floor: PSNR (dB) over the training clips' drawn pixels (the shapes). A fit that
#: draws every shape in their mean colour scores about 10 (seed 8 under AVX2: 10.1 on held-out
#: clips while its whole-frame PSNR was 17.0; its demo's samples showed no colour), one that
#: shows them over 20 (seed 9 under AVX2: 23.6; whole-frame 18.3). 19, not 16: native seed 3's
#: first fit scored 17.2 and gave every blue clip back green (its samples drew the 4 blue
#: held-out captions green), as the stepvideo demo's seed 3 did at 17.2
DRAWN_PSNR_FLOOR = 19.0


def train_vae(seed: int) -> tuple[Any, dict[str, Any]]:
    """The demo's VAE (4x in space and time, residual) trained on moving-shape clips
    (:func:`mmcore.engines.train_demo_vae_until`, as the wan pack's demo fits it), fitted afresh
    (3 fits at most) while it draws the shapes without their colour."""
    import torch
    from diffusers import AutoencoderKLWan

    from mmcore.data import moving_shape_clips
    from mmcore.engines import train_demo_vae_until

    def make_vae(attempt: int) -> Any:
        if attempt:  # the first from the seeded state frozen_parts left, as before; a refit from its own seed
            torch.manual_seed(seed + 1000 * attempt)
        return AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[True, True], is_residual=True, scale_factor_spatial=4)

    clips, held_out = moving_shape_clips(96, seed + 1_000), moving_shape_clips(16, seed + 2_000)
    return train_demo_vae_until(make_vae, clips, held_out, drawn_psnr_floor=DRAWN_PSNR_FLOOR, steps=650, frame_steps=500, lr=2e-3, batch=2, seed=seed)


def tiny_wfvae() -> Any:
    """A WF-VAE of the released config's fields and block choices, narrow (random weights, from the seeded state)."""
    from mm_pack_opensoraplan.wfvae import WFVAEModel

    return WFVAEModel(
        latent_dim=8,
        base_channels=8,
        encoder_energy_flow_hidden_size=8,
        decoder_energy_flow_hidden_size=8,
        encoder_num_resblocks=1,
        decoder_num_resblocks=1,
        norm_type="layernorm",
        t_interpolation="trilinear",
        connect_res_layer_num=1,
        scale=[0.7 + 0.1 * i for i in range(8)],
        shift=[0.05 * i - 0.2 for i in range(8)],
    )


def latent_channels(vae: Any) -> int:
    return vae.config.latent_dim if "latent_dim" in vae.config else vae.config.z_dim


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    from mm_pack_opensoraplan.pipeline import OpenSoraPlanPipeline

    p = pick_preset(PRESETS, preset)
    parts = frozen_parts(p, seed)
    measured = parts.pop("measured")
    denoiser = transformer(p, latent_channels(parts["vae"]), parts["text_encoder"].config.d_model, parts["text_encoder_2"].config.projection_dim)
    OpenSoraPlanPipeline(transformer=denoiser, **parts).save_pretrained(out)
    if p.get("wfvae"):  # the reference's layout, not save_pretrained's safetensors
        import shutil

        from mm_pack_opensoraplan.wfvae_io import save_released

        shutil.rmtree(out / "vae")
        save_released(parts["vae"], out / "vae")
    if measured is not None:
        from mmcore.engines import write_demo_vae_report

        write_demo_vae_report(out, measured)
