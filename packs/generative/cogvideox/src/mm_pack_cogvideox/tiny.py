"""Tiny random-weight CogVideoX pipelines built from config (how tests and the demo run offline).

``init:tiny`` and ``init:demo`` write the diffusers layout ``CogVideoXPipeline.from_pretrained``
loads: ``transformer/`` (CogVideoX 1.0 5B's layout: 3D rotary positions, no positional
embeddings), ``vae/`` (the 3D causal VAE: 8x space, 4x time, 16 channels), ``text_encoder/`` +
``tokenizer/`` (T5), ``scheduler/`` (``CogVideoXDDIMScheduler`` as the 5B ships it:
v-prediction, zero terminal SNR, trailing timesteps). ``init:demo``'s VAE is smaller in space
(4x, so a 32 px clip is 8x8 latents) and trained to reconstruct the demo's moving shapes
(:func:`mmcore.engines.train_demo_vae`; ``demo_vae.json`` states how well).
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
    "a green circle moves up",
    "a panda playing a guitar in a bamboo forest",
    "slow motion, bright light",
]

PRESETS = {
    "tiny": {"text_dim": 32, "heads": 2, "head_dim": 16, "layers": 2, "vae_channels": (8, 8, 16, 16)},
    # three VAE blocks: 4x in space (2 ** (blocks - 1), as the pipeline reads it), 4x in time (the
    # first two compress time): a 32 px, 9-frame clip is 3 x 8 x 8 latents, 48 tokens of 2 x 2;
    # its VAE trains 650 steps, the first 500 on single frames
    "demo": {"text_dim": 32, "heads": 4, "head_dim": 16, "layers": 3, "vae_channels": (16, 16, 32), "demo_vae": (650, 500)},
    # the demo's model with a VAE trained 12 steps (the demo path in a short test: it reconstructs little)
    "demo-quick": {"text_dim": 32, "heads": 4, "head_dim": 16, "layers": 3, "vae_channels": (16, 16, 32), "demo_vae": (12, 10)},
}


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    import torch
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline, CogVideoXTransformer3DModel
    from diffusers.utils import logging as diffusers_logging
    from transformers import T5Config, T5EncoderModel
    from transformers.utils import logging as hf_logging

    from mmcore.engines import unigram_tokenizer

    p = pick_preset(PRESETS, preset)
    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    tokenizer = unigram_tokenizer(CORPUS)
    dim = p["text_dim"]
    text_encoder = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=dim,
            d_kv=8,
            d_ff=2 * dim,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    ).eval()
    channels = p["vae_channels"]
    vae = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * len(channels),
        up_block_types=("CogVideoXUpBlock3D",) * len(channels),
        block_out_channels=channels,
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=4,
        temporal_compression_ratio=4,
        sample_height=32,
        sample_width=32,
        scaling_factor=0.7,
    ).eval()
    measured = train_vae(vae, seed, *p["demo_vae"]) if p.get("demo_vae") else None
    latent_side = 32 // 2 ** (len(channels) - 1)  # the rotary grid's base: a 32 px clip's latents
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=p["heads"],
        attention_head_dim=p["head_dim"],
        in_channels=16,
        out_channels=16,
        time_embed_dim=32,
        text_embed_dim=dim,
        num_layers=p["layers"],
        sample_width=latent_side,
        sample_height=latent_side,
        sample_frames=9,
        patch_size=2,
        max_text_seq_length=16,
        use_rotary_positional_embeddings=True,
    )
    scheduler = CogVideoXDDIMScheduler(
        beta_schedule="scaled_linear", clip_sample=False, prediction_type="v_prediction", rescale_betas_zero_snr=True, set_alpha_to_one=True, snr_shift_scale=1.0, timestep_spacing="trailing"
    )
    CogVideoXPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler).save_pretrained(out)
    if measured is not None:  # beside the pipeline: evaluate reports its reconstruction PSNR
        from mmcore.engines import write_demo_vae_report

        write_demo_vae_report(out, measured)


def train_vae(vae, seed: int, steps: int, frame_steps: int) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Train the demo's VAE on moving-shape clips (:func:`mmcore.engines.train_demo_vae`, which
    then sets ``scaling_factor``, what ``CogVideoXPipeline`` scales latents by, from their
    spread): ``frame_steps`` on single frames first (the causal VAE encodes a clip's first frame
    alone), the rest of ``steps`` on 9-frame clips; held-out PSNR on 16 other clips."""
    from mmcore.data import moving_shape_clips
    from mmcore.engines import train_demo_vae

    clips, held_out = moving_shape_clips(96, seed + 1_000), moving_shape_clips(16, seed + 2_000)
    return train_demo_vae(vae, clips, held_out, steps=steps, frame_steps=frame_steps, lr=2e-3, batch=2, seed=seed)
