"""Tiny random-weight FLUX pipelines built from config (how tests and the demo run offline).

``init:tiny`` and ``init:demo`` write the diffusers layout ``FluxPipeline.from_pretrained``
loads: ``transformer/`` (with the guidance embedding, as FLUX.1-dev), ``vae/`` (four blocks:
8x downsampling, 16 latent channels, FLUX's shift and scale), ``text_encoder/`` + ``tokenizer/``
(CLIP), ``text_encoder_2/`` + ``tokenizer_2/`` (T5), ``scheduler/`` (FLUX's dynamic shift).
"""

from __future__ import annotations

from pathlib import Path

from mmcore.data import COLOURS, SHAPES
from mmcore.engines import pick_preset

CORPUS = [f"a {colour} {shape}" for colour in sorted(COLOURS) for shape in SHAPES] + ["a photo of a cat", "an image of a dog on the grass", "white background, bright light"]

PRESETS = {
    "tiny": {"text_dim": 32, "heads": 2, "head_dim": 16, "double": 1, "single": 1},
    # the demo's VAE is trained to reconstruct the demo's pictures (demo_vae.json says how well)
    "demo": {"text_dim": 32, "heads": 4, "head_dim": 16, "double": 2, "single": 2, "demo_vae": True},
}


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from diffusers.utils import logging as diffusers_logging
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
    from transformers.utils import logging as hf_logging

    from mmcore.engines import clip_tokenizer, unigram_tokenizer

    p = pick_preset(PRESETS, preset)
    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = clip_tokenizer(CORPUS), unigram_tokenizer(CORPUS)
    dim = p["text_dim"]
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=dim,
            intermediate_size=2 * dim,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
            projection_dim=dim,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).eval()
    text_encoder_2 = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer_2),
            d_model=dim,
            d_kv=8,
            d_ff=2 * dim,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer_2.pad_token_id,
            eos_token_id=tokenizer_2.eos_token_id,
        )
    ).eval()
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=8,
        sample_size=64,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()
    measured = None
    if p.get("demo_vae"):
        from mmcore.engines import train_demo_vae

        from mm_pack_flux.demo import demo_images

        measured = train_demo_vae(vae, demo_images(96, seed + 1_000), demo_images(16, seed + 2_000), steps=600, lr=3e-3, batch=8, seed=seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=p["double"],
        num_single_layers=p["single"],
        attention_head_dim=p["head_dim"],
        num_attention_heads=p["heads"],
        joint_attention_dim=dim,
        pooled_projection_dim=dim,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, transformer=transformer).save_pretrained(out)
    if measured is not None:
        from mmcore.engines import write_demo_vae_report

        write_demo_vae_report(out, measured)
