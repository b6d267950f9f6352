"""Tiny random-weight LTX-2 pipelines built from config (how tests and the demo run offline).

``init:tiny`` writes the diffusers layout ``LTX2Pipeline.from_pretrained`` loads, the released
checkpoints' (Lightricks/LTX-2 in diffusers form): ``transformer/`` (the joint audio-video
denoiser), ``vae/`` (AutoencoderKLLTX2Video), ``audio_vae/`` (AutoencoderKLLTX2Audio, log-mel
in and out), ``vocoder/`` (LTX2Vocoder: mel -> waveform), ``text_encoder/``
(Gemma3ForConditionalGeneration, a tiny SigLIP tower included as the class has one),
``tokenizer/`` (GemmaTokenizerFast over a small word vocabulary), ``connectors/``
(LTX2TextConnectors: Gemma's stacked hidden states -> the video and the audio caption streams)
and ``scheduler/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.engines import pick_preset

WORDS = "a red green blue square circle moves left right up down low middle high tone video of the with".split()

PRESETS = {
    "tiny": {"text_dim": 32, "text_layers": 2, "layers": 2, "heads": 2, "head_dim": 16, "audio_heads": 2, "audio_head_dim": 8},
    # the demo's VAEs are trained at init:demo on the demo's kind of clips and tones (demo_vae):
    # samples whose colour can be seen and whose pitch can be read
    "demo": {"text_dim": 32, "text_layers": 2, "layers": 3, "heads": 4, "head_dim": 16, "audio_heads": 2, "audio_head_dim": 16, "demo_vae": True},
}

#: the tiny audio VAE: 16 mel bins -> 4 latent bins x 4 channels (16 packed features, the
#: size of its latents_mean/std), 4x in time (LTX-2's)
MEL_BINS, AUDIO_LATENT_CHANNELS = 16, 4


def build_tokenizer():  # type: ignore[no-untyped-def]
    """Gemma's tokenizer class over the corpus's words (whole) and letters (fallback), with Gemma's
    special tokens: built, not trained (the same ids every time)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GemmaTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"])}
    for word in WORDS:
        vocab.setdefault("\u2581" + word, len(vocab))
    for letter in "abcdefghijklmnopqrstuvwxyz,.":
        vocab.setdefault(letter, len(vocab))
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="<unk>", continuing_subword_prefix="", max_input_chars_per_word=100))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    return GemmaTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>", padding_side="left")


def build_parts(p: dict, seed: int) -> dict:  # type: ignore[type-arg]
    """Every component of a tiny ``LTX2Pipeline``, seeded (frozen parts first, the transformer last)."""
    import torch
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from diffusers.utils import logging as diffusers_logging
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    dim, layers = p["text_dim"], p["text_layers"]
    text_encoder = Gemma3ForConditionalGeneration(
        Gemma3Config(
            text_config={
                "vocab_size": len(tokenizer),
                "hidden_size": dim,
                "intermediate_size": 2 * dim,
                "num_hidden_layers": layers,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 16,
                "max_position_embeddings": 128,
                "sliding_window": 16,
            },
            vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
            mm_tokens_per_image=4,
            boi_token_index=4,
            eoi_token_index=5,
            image_token_index=6,
        )
    ).eval()
    # LTX-2.0's connectors: Gemma's layers (+ embeddings) stacked, one projection, a small
    # transformer per stream with learnt registers standing in for the padding
    connectors = LTX2TextConnectors(
        caption_channels=dim,
        text_proj_in_factor=layers + 1,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=dim // 2,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=dim // 2,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8,
        connector_rope_base_seq_len=128,
    ).eval()
    vae = AutoencoderKLLTX2Video(**video_vae_config(bool(p.get("demo_vae"))))
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=AUDIO_LATENT_CHANNELS * MEL_BINS // 4,
        ch_mult=(1, 2, 4),
        num_res_blocks=1,
        in_channels=2,
        output_channels=2,
        latent_channels=AUDIO_LATENT_CHANNELS,
        mel_bins=MEL_BINS,
        resolution=64,
    ).eval()
    # mel [B, 2, T, 16] -> waveform at 16 kHz: 160 samples a mel frame (5 x 4 x 8)
    vocoder = LTX2Vocoder(
        in_channels=2 * MEL_BINS,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[10, 8, 16],
        upsample_factors=[5, 4, 8],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1]],
        output_sampling_rate=16000,
    ).eval()
    audio_dim = p["audio_heads"] * p["audio_head_dim"]
    transformer = LTX2VideoTransformer3DModel(
        in_channels=16,
        out_channels=16,
        num_attention_heads=p["heads"],
        attention_head_dim=p["head_dim"],
        cross_attention_dim=p["heads"] * p["head_dim"],
        vae_scale_factors=(4, 8, 8),
        audio_in_channels=AUDIO_LATENT_CHANNELS * MEL_BINS // 4,
        audio_out_channels=AUDIO_LATENT_CHANNELS * MEL_BINS // 4,
        audio_num_attention_heads=p["audio_heads"],
        audio_attention_head_dim=p["audio_head_dim"],
        audio_cross_attention_dim=audio_dim,
        num_layers=p["layers"],
        caption_channels=dim,
        base_height=256,
        base_width=256,
    )
    measured = {**train_vae(vae, seed), "audio_vae": train_audio_vae(audio_vae, seed)} if p.get("demo_vae") else None
    vae.eval()
    audio_vae.eval()
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024, max_image_seq_len=4096)
    parts = {"scheduler": scheduler, "vae": vae, "audio_vae": audio_vae, "text_encoder": text_encoder, "tokenizer": tokenizer, "connectors": connectors, "transformer": transformer, "vocoder": vocoder}
    return {**parts, "measured": measured} if measured is not None else parts


def video_vae_config(demo: bool) -> dict:  # type: ignore[type-arg]
    """The tiny ``AutoencoderKLLTX2Video``: 2x2 pixel patches, then two stages 2x in space and
    time, so 8x in space and 4x in time: 32x32x9 -> [16, 3, 4, 4]. The demo's (trained) is twice
    as wide."""
    width = (16, 32) if demo else (8, 16)
    return {
        "latent_channels": 16,
        "block_out_channels": width,
        "down_block_types": ("LTX2VideoDownBlock3D", "LTX2VideoDownBlock3D"),
        "decoder_block_out_channels": width,
        "layers_per_block": (1, 1, 1),
        "decoder_layers_per_block": (1, 1, 1),
        "spatio_temporal_scaling": (True, True),
        "decoder_spatio_temporal_scaling": (True, True),
        "decoder_inject_noise": (False, False, False),
        "downsample_type": ("spatiotemporal", "spatiotemporal"),
        "upsample_type": ("spatiotemporal", "spatiotemporal"),
        "upsample_residual": (True, True),
        "upsample_factor": (2, 2),
        "patch_size": 2,
    }


def train_vae(vae, seed: int) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Train the demo's video VAE on moving-shape clips (:func:`mmcore.engines.train_demo_vae`, as
    wan's: single frames first, then clips), its ``latents_mean``/``latents_std`` buffers set from
    its latents; held-out PSNR on 16 other clips."""
    from mmcore.data import moving_shape_clips
    from mmcore.engines import train_demo_vae

    clips, held_out = moving_shape_clips(96, seed + 1_000), moving_shape_clips(16, seed + 2_000)
    return train_demo_vae(vae, clips, held_out, steps=650, frame_steps=500, lr=2e-3, batch=2, seed=seed)


def train_audio_vae(audio_vae, seed: int, steps: int = 200, batch: int = 4, lr: float = 2e-3) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """Train the demo's audio VAE to reconstruct the log-mels of the demo's tones (each colour's
    pitch ±2 %, random loudness, over a clip's 1.125 s): ``steps`` of AdamW on the squared
    error of the posterior mode's decoding, seeded; then set its ``latents_mean``/``latents_std``
    (per packed feature, as the pipeline normalises) from the tones' latents. Returns the
    held-out log-mel error, the share of held-out reconstructions whose loudest band has the
    tone's pitch (what the demo's pitch check reads), steps, seconds."""
    import random
    import time

    import torch

    from mm_pack_ltx2.demo import FPS, PITCH, band_centres, nearest_pitch, tone
    from mmcore.engines import fit_demo_autoencoder
    from mm_pack_ltx2.sound import audio_latents, log_mel, pack_audio

    start = time.perf_counter()
    rng = random.Random(seed + 3_000)
    seconds = 9 / FPS

    def tones(count: int) -> tuple[list, Any, list]:  # type: ignore[type-arg]
        colours = [rng.choice(sorted(PITCH)) for _ in range(count)]
        waves = [tone(PITCH[c], seconds, rng) for c in colours]
        return waves, torch.cat([log_mel(w, audio_vae) for w in waves]), colours

    waves, mels, _ = tones(96)
    _, held, held_colours = tones(24)

    def loss_of(step: int, draw: Any) -> Any:
        chosen = mels[torch.randint(len(mels), (batch,), generator=draw)]
        out = audio_vae.decode(audio_vae.encode(chosen).latent_dist.mode()).sample[:, :, : chosen.shape[2]]
        return (out - chosen).pow(2).mean()

    fit_demo_autoencoder(audio_vae, loss_of, steps=steps, lr=lr, seed=seed)
    with torch.no_grad():
        out = audio_vae.decode(audio_vae.encode(held).latent_dist.mode()).sample[:, :, : held.shape[2]]
        centres = band_centres(MEL_BINS, int(audio_vae.config.sample_rate))
        heard = [nearest_pitch(float(centres[int(o.mean((0, 1)).argmax())])) for o in out]
        audio_vae.latents_mean.zero_()
        audio_vae.latents_std.fill_(1.0)
        tokens = torch.cat([pack_audio(audio_latents(audio_vae, w)[None])[0] for w in waves])  # [clips x L, C * M']
        audio_vae.latents_mean.copy_(tokens.mean(0))
        audio_vae.latents_std.copy_(tokens.std(0))
    return {
        "held_out_mel_mse": round(float((out - held).pow(2).mean()), 4),
        "held_out_pitch_agreement": sum(h == c for h, c in zip(heard, held_colours)) / len(held),
        "clips": len(waves),
        "held_out_clips": len(held),
        "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
    }


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    from diffusers import LTX2Pipeline

    from mmcore.engines import write_demo_vae_report

    parts = build_parts(pick_preset(PRESETS, preset), seed)
    measured = parts.pop("measured", None)
    LTX2Pipeline(**parts).save_pretrained(out)
    if measured is not None:
        write_demo_vae_report(out, measured)
