"""Wan2.1 / Wan2.2 text-to-video as the diffusion kit sees it: the denoiser and pipeline classes,
the frozen VAE and UMT5 used exactly as ``WanPipeline`` uses them, the denoiser's call. The kit
(:mod:`mmcore.kits.diffusion`) does preprocessing, extract, flow-matching training and export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore import StageContext, StageError
from mmcore.data import caption_agreement, write_moving_shapes, write_moving_square_preferences
from mmcore.kits import DiffusionFamily, text_to_video_sample

from mm_pack_wan.adapter import ADAPTER

FREEZE_GROUPS = {
    "blocks": ["blocks.*"],
    "embeddings": ["patch_embedding.*", "condition_embedder.*"],
    "head": ["proj_out.*", "norm_out.*", "scale_shift_table"],
}


class Encoders:
    """The frozen VAE and UMT5 of a Wan checkpoint, used exactly as ``WanPipeline`` uses them."""

    pipeline_class = "WanPipeline"

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        import diffusers
        import torch

        self.pipe = getattr(diffusers, self.pipeline_class).from_pretrained(model_dir, transformer=None)
        self.pipe.vae.eval()
        self.pipe.text_encoder.eval()
        self.max_sequence_length = max_sequence_length
        cfg = self.pipe.vae.config
        self.mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)

    def latents(self, frames: Any) -> Any:
        """uint8 (F, H, W, 3) -> normalised latents (16, F', H', W'), as the pipeline expects them."""
        import torch

        side = 2 * self.pipe.vae_scale_factor_spatial  # every Wan transformer patches 2 x 2 latents
        if frames.shape[1] % side or frames.shape[2] % side:
            raise StageError(
                f"bucket {frames.shape[1]}x{frames.shape[2]}: this checkpoint's VAE compresses {self.pipe.vae_scale_factor_spatial}x "
                f"and its transformer patches 2x2 latents: height and width must be multiples of {side} (data.buckets)"
            )
        with torch.no_grad():
            video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
            z = self.pipe.vae.encode(video).latent_dist.mode()
            return ((z - self.mean) / self.std)[0]

    def text(self, caption: str) -> Any:
        import torch

        with torch.no_grad():
            embeds, _ = self.pipe.encode_prompt(caption, do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length, device=torch.device("cpu"))
            return embeds[0]


def predict(model: Any, noisy: Any, sigma: Any, text: Any, expand_timesteps: bool = False) -> Any:
    import torch

    timestep = sigma * 1000
    if expand_timesteps:  # Wan2.2 TI2V's pipeline: the same timestep for every token, given per token
        timestep = token_timesteps(model, torch.ones_like(noisy[:, :1], dtype=torch.float32), timestep)
    return model(hidden_states=noisy, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]


def token_timesteps(model: Any, mask: Any, timestep: Any) -> Any:
    """Wan2.2 TI2V's timesteps, one per patch token [B, tokens], as its pipelines give them:
    ``mask`` [B, 1, F', H', W'] (0 where a latent is given: timestep 0) times each sample's
    ``timestep``, taken at every patch's first latent."""
    p_t, p_h, p_w = model.config.patch_size
    return (mask[:, 0, ::p_t, ::p_h, ::p_w] * timestep.view(-1, 1, 1, 1)).flatten(1)


def checkpoint_options(model_dir: Path) -> dict[str, Any]:
    """``expand_timesteps`` where the pipeline folder's ``model_index.json`` sets it (Wan2.2
    TI2V-5B: a timestep per token, the first frame's 0 in image-to-video)."""
    import json

    index = model_dir / "model_index.json"
    return {"expand_timesteps": True} if index.is_file() and json.loads(index.read_text()).get("expand_timesteps") else {}


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random latents and text states)."""
    import torch

    return {
        "hidden_states": torch.randn(1, model.config.in_channels, 3, 4, 4, generator=generator),
        "timestep": torch.tensor([500.0]),
        "encoder_hidden_states": torch.randn(1, ctx.config.data.max_sequence_length, model.config.text_dim, generator=generator),
    }


FAMILY = DiffusionFamily(
    transformer_class="WanTransformer3DModel",
    pipeline_class="WanPipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    checkpoint_options=checkpoint_options,
    sample=text_to_video_sample,
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("blocks",),
    demo=write_moving_shapes,
    preference_demo=write_moving_square_preferences,
    demo_checker=caption_agreement,
)
