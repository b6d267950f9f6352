"""Tiny random-weight CogVideoX pipelines built from config (how tests and the demo run offline).

``init:tiny`` and ``init:demo`` write the diffusers layout ``CogVideoXPipeline.from_pretrained``
loads: ``transformer/`` (CogVideoX 1.0 5B's layout: 3D rotary positions, no positional
embeddings), ``vae/`` (the 3D causal VAE: 8x space, 4x time, 16 channels), ``text_encoder/`` +
``tokenizer/`` (T5), ``scheduler/`` (``CogVideoXDDIMScheduler`` as the 5B ships it:
v-prediction, zero terminal SNR, trailing timesteps).
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
    "a panda playing a guitar in a bamboo forest",
    "slow motion, bright light",
]

PRESETS = {
    "tiny": {"text_dim": 32, "heads": 2, "head_dim": 16, "layers": 2},
    "demo": {"text_dim": 32, "heads": 4, "head_dim": 16, "layers": 3},
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
    vae = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 16, 16), layers_per_block=1, latent_channels=16, norm_num_groups=4, temporal_compression_ratio=4, sample_height=32, sample_width=32, scaling_factor=0.7
    ).eval()
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=p["heads"],
        attention_head_dim=p["head_dim"],
        in_channels=16,
        out_channels=16,
        time_embed_dim=32,
        text_embed_dim=dim,
        num_layers=p["layers"],
        sample_width=4,
        sample_height=4,
        sample_frames=9,
        patch_size=2,
        max_text_seq_length=16,
        use_rotary_positional_embeddings=True,
    )
    scheduler = CogVideoXDDIMScheduler(
        beta_schedule="scaled_linear", clip_sample=False, prediction_type="v_prediction", rescale_betas_zero_snr=True, set_alpha_to_one=True, snr_shift_scale=1.0, timestep_spacing="trailing"
    )
    CogVideoXPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler).save_pretrained(out)
