"""Tiny random-weight Wan pipelines built from config (how tests and the demo run offline).

``init:tiny`` writes the diffusers layout ``WanPipeline.from_pretrained`` loads: ``transformer/``,
``vae/``, ``text_encoder/`` (UMT5), ``tokenizer/`` (a small unigram tokenizer), ``scheduler/``.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

CORPUS = [
    "a red square moves left",
    "a red square moves right",
    "a red square moves up",
    "a red square moves down",
    "a blue square moves left",
    "a blue square moves right",
    "a blue square moves up",
    "a blue square moves down",
    "a green circle on a white background",
    "a yellow triangle",
    "video of a cat",
    "slow motion, bright light",
]

PRESETS = {
    "tiny": {"text_dim": 32, "text_layers": 2, "vae_base": 8, "heads": 2, "head_dim": 16, "layers": 2, "ffn": 64},
    # the demo's VAE is trained to reconstruct the demo's clips (demo_vae): 4x in space, so a 32 px
    # clip is 8x8 latents; residual (Wan2.2's pixel-shuffle shortcuts), which learns colour fast
    "demo": {"text_dim": 32, "text_layers": 2, "vae_base": 8, "heads": 4, "head_dim": 16, "layers": 3, "ffn": 128, "demo_vae": True},
    # the DPO demo's model: the demo's, with its random 8x VAE
    "dpo": {"text_dim": 32, "text_layers": 2, "vae_base": 8, "heads": 4, "head_dim": 16, "layers": 3, "ffn": 128},
    # another tiny text encoder and VAE (a test: a new model invalidates the feature cache)
    "tiny-b": {"text_dim": 32, "text_layers": 1, "vae_base": 4, "heads": 2, "head_dim": 16, "layers": 2, "ffn": 64},
    # Wan2.2 A14B's layout: two experts, the high-noise one above the boundary (model_index.json)
    "tiny-a14b": {"text_dim": 32, "text_layers": 2, "vae_base": 8, "heads": 2, "head_dim": 16, "layers": 2, "ffn": 64, "boundary_ratio": 0.875},
    # Wan2.2 TI2V-5B's layout: the 48-channel VAE (2x2 pixel patches in, 16x spatial), one
    # transformer on 48 channels, expand_timesteps (a timestep per token) in model_index.json
    "tiny-ti2v": {"text_dim": 32, "text_layers": 2, "vae_base": 8, "heads": 2, "head_dim": 16, "layers": 2, "ffn": 64, "ti2v": True},
    "demo-ti2v": {"text_dim": 32, "text_layers": 2, "vae_base": 8, "heads": 4, "head_dim": 16, "layers": 3, "ffn": 128, "ti2v": True},
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    """A T5-style unigram tokenizer over the corpus's words and characters (UMT5's class)."""
    from mmcore.engines import unigram_tokenizer

    return unigram_tokenizer(CORPUS)


def frozen_parts(p: dict, seed: int):  # type: ignore[no-untyped-def, type-arg]
    """The seeded tokenizer, UMT5 and VAE every Wan pipeline here shares (built first: the
    transformer's initialisation follows them in the generator)."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler
    from diffusers.utils import logging as diffusers_logging
    from transformers import UMT5Config, UMT5EncoderModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer),
            d_model=p["text_dim"],
            d_kv=8,
            d_ff=2 * p["text_dim"],
            num_layers=p["text_layers"],
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    ).eval()
    if p.get("ti2v"):  # TI2V-5B's VAE: residual, 48 channels, 2x2 patches of pixels first (in_channels 12)
        vae = AutoencoderKLWan(
            base_dim=p["vae_base"],
            decoder_base_dim=p["vae_base"] + 4,
            z_dim=48,
            dim_mult=[1, 2, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            is_residual=True,
            in_channels=12,
            out_channels=12,
            patch_size=2,
            scale_factor_spatial=16,
            latents_mean=[0.0] * 48,
            latents_std=[1.0] * 48,
        ).eval()
    elif p.get("demo_vae"):
        vae = AutoencoderKLWan(base_dim=p["vae_base"], z_dim=16, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[True, True], is_residual=True, scale_factor_spatial=4)
        measured = train_vae(vae, seed)
    else:
        vae = AutoencoderKLWan(base_dim=p["vae_base"], z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True]).eval()
    parts = {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": vae, "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0)}
    return {**parts, "measured": measured} if p.get("demo_vae") else parts


def train_vae(vae, seed: int) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Train the demo's VAE on moving-shape clips (:func:`mmcore.engines.train_demo_vae`): on their
    first 5 frames (one latent frame plus four: the causal VAE encodes 9 alike), held-out PSNR
    on 16 other clips of 9 frames."""
    from mmcore.data import moving_shape_clips
    from mmcore.engines import train_demo_vae

    clips, held_out = moving_shape_clips(96, seed + 1_000), moving_shape_clips(16, seed + 2_000)
    return train_demo_vae(vae, clips, held_out, steps=650, frame_steps=500, lr=2e-3, batch=2, seed=seed)


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    from diffusers import WanPipeline, WanTransformer3DModel

    p = pick_preset(PRESETS, preset)
    parts = frozen_parts(p, seed)
    measured = parts.pop("measured", None)
    channels = parts["vae"].config.z_dim
    experts = [
        WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=p["heads"],
            attention_head_dim=p["head_dim"],
            in_channels=channels,
            out_channels=channels,
            text_dim=p["text_dim"],
            freq_dim=32,
            ffn_dim=p["ffn"],
            num_layers=p["layers"],
            rope_max_seq_len=64,
        )
        for _ in range(2 if "boundary_ratio" in p else 1)
    ]
    if len(experts) == 2:
        parts.update(transformer_2=experts[1], boundary_ratio=p["boundary_ratio"])
    WanPipeline(transformer=experts[0], expand_timesteps=bool(p.get("ti2v")), **parts).save_pretrained(out)
    write_measured(measured, out)


def write_measured(measured: dict | None, out: Path) -> None:  # type: ignore[type-arg]
    """The demo VAE's figures beside the pipeline (``demo_vae.json``: evaluate reports them)."""
    if measured is not None:
        from mmcore.engines import write_demo_vae_report

        write_demo_vae_report(out, measured)


def build_i2v_checkpoint(preset: str, out: Path, seed: int) -> None:
    """``WanImageToVideoPipeline``'s layout, Wan2.1 I2V's: the t2v parts, a transformer reading
    16 + 20 channels and cross-attending to CLIP image features (``image_dim``), and
    ``image_encoder/`` + ``image_processor/`` (a tiny CLIP vision tower at 32 px)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    p = pick_preset(PRESETS, preset)
    if p.get("ti2v"):  # TI2V-5B is one checkpoint for both pipelines (model_index.json names WanPipeline)
        return build_init_checkpoint(preset, out, seed)
    parts = frozen_parts(p, seed)
    measured = parts.pop("measured", None)
    image_encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)).eval()
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=p["heads"],
        attention_head_dim=p["head_dim"],
        in_channels=36,
        out_channels=16,
        text_dim=p["text_dim"],
        freq_dim=32,
        ffn_dim=p["ffn"],
        num_layers=p["layers"],
        rope_max_seq_len=64,
        image_dim=32,
        added_kv_proj_dim=p["heads"] * p["head_dim"],
    )
    WanImageToVideoPipeline(image_processor=image_processor, image_encoder=image_encoder, transformer=transformer, **parts).save_pretrained(out)
    write_measured(measured, out)
