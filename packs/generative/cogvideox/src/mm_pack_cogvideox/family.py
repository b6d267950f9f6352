"""CogVideoX text-to-video as the diffusion kit sees it: the denoiser and pipeline classes, the
frozen 3D VAE and T5 used exactly as ``CogVideoXPipeline`` uses them, the denoiser's call. The
kit (:mod:`mmcore.kits.diffusion`) does preprocessing, extract, training and export.

CogVideoX is not a flow-matching model: it was trained with v-prediction on a DDPM schedule
rescaled to zero terminal SNR (``CogVideoXDDIMScheduler``: ``prediction_type: v_prediction``,
``rescale_betas_zero_snr: true``, its ``snr_shift_scale``). The objective is read from the
checkpoint's own ``scheduler/`` (:class:`mmcore.kits.diffusion.NoiseSchedule`), so a checkpoint
trains with the schedule it samples with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from mmcore.config import RunConfig
from mmcore import StageContext
from mmcore.engines import RenameAdapter
from mmcore.data import caption_agreement, write_moving_shapes
from mmcore import StageError
from mmcore.kits import DiffusionFamily, DiffusionTraining, NoiseSchedule, SampleExport, VideoData, denoiser_flops, rotary_positions_3d, text_to_video_sample


class CogVideoXData(VideoData):
    """Buckets as CogVideoX's VAE takes them: frames = 4k+1, sizes multiples of 16."""

    size_multiple, size_reason, frame_stride = 16, "VAE 8 x patch 2", 4


class CogVideoXConfig(RunConfig):
    data: CogVideoXData = Field(default_factory=CogVideoXData)
    training: DiffusionTraining = Field(default_factory=DiffusionTraining)  # the schedule is the checkpoint's
    export: SampleExport = Field(default_factory=lambda: SampleExport(guidance_scale=6.0))  # CogVideoXPipeline's default


# The diffusers CogVideoX transformer trains under its own parameter names.
ADAPTER = RenameAdapter(rules=[])

FREEZE_GROUPS = {
    "blocks": ["transformer_blocks.*"],
    "embeddings": ["patch_embed.*", "time_embedding.*", "ofs_embedding.*"],
    "head": ["norm_final.*", "norm_out.*", "proj_out.*"],
}


class Encoders:
    """The frozen 3D VAE and T5 of a CogVideoX checkpoint, used exactly as ``CogVideoXPipeline`` uses them."""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        import json

        from diffusers import CogVideoXPipeline

        config = json.loads((model_dir / "transformer" / "config.json").read_text())
        if not config.get("use_rotary_positional_embeddings") and max_sequence_length != config.get("max_text_seq_length", 226):
            raise StageError(
                f"data.max_sequence_length={max_sequence_length}: this CogVideoX (positional embeddings, 1.0 2B) reads exactly "
                f"max_text_seq_length={config.get('max_text_seq_length', 226)} text tokens; set it to that"
            )
        self.pipe = CogVideoXPipeline.from_pretrained(model_dir, transformer=None)
        self.pipe.vae.eval()
        self.pipe.text_encoder.eval()
        self.max_sequence_length = max_sequence_length
        self.scale = self.pipe.vae.config.scaling_factor

    def latents(self, frames: Any) -> Any:
        """uint8 (F, H, W, 3) -> scaled latents (16, F', H', W'), the mode of the VAE's posterior
        (deterministic, so the cache is; CogVideoX's trainers draw a sample of it)."""
        import torch

        with torch.no_grad():
            video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
            return (self.pipe.vae.encode(video).latent_dist.mode() * self.scale)[0]

    def text(self, caption: str) -> Any:
        import torch

        with torch.no_grad():
            embeds, _ = self.pipe.encode_prompt(caption, do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length, device=torch.device("cpu"))
            return embeds[0]


def predict(model: Any, noisy: Any, timesteps: Any, text: Any) -> Any:
    """The model's output for latents [B, C, F, H, W] (the kit's layout; CogVideoX reads
    [B, F, C, H, W]) at integer ``timesteps``."""
    hidden = noisy.permute(0, 2, 1, 3, 4)
    _, frames, _, height, width = hidden.shape
    patch_t = model.config.patch_size_t
    if patch_t and frames % patch_t:
        raise StageError(
            f"{frames} latent frames: this CogVideoX (1.5) patches {patch_t} latent frames together; choose bucket frames f with ((f - 1) / 4 + 1) a multiple of {patch_t} (e.g. 5, 13, 21)"
        )
    out = model(hidden_states=hidden, encoder_hidden_states=text, timestep=timesteps, image_rotary_emb=rotary_positions_3d(model, frames, height, width, hidden.device), return_dict=False)[0]
    return out.permute(0, 2, 1, 3, 4)


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random latents and text states)."""
    import torch

    frames = model.config.patch_size_t or 2
    return {
        "hidden_states": torch.randn(1, frames, model.config.in_channels, 4, 4, generator=generator),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, ctx.config.data.max_sequence_length, model.config.text_embed_dim, generator=generator),
        "image_rotary_emb": rotary_positions_3d(model, frames, 4, 4, torch.device("cpu")),
    }


FAMILY = DiffusionFamily(
    transformer_class="CogVideoXTransformer3DModel",
    pipeline_class="CogVideoXPipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    sample=text_to_video_sample,
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("transformer_blocks",),
    demo=write_moving_shapes,
    demo_checker=caption_agreement,
    objective=NoiseSchedule.of,
    flops=lambda: denoiser_flops(joint_text=True),  # text and video tokens attend as one sequence
)
