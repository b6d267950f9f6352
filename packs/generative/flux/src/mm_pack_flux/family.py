"""FLUX text-to-image as the diffusion kit sees it: the denoiser and pipeline classes, the frozen
VAE, CLIP and T5 used exactly as ``FluxPipeline`` uses them, and the denoiser's call. The kit
(:mod:`mmcore.kits.diffusion`) does preprocessing (images are one-frame buckets), extract,
flow-matching training and export.

FLUX reads its latents as 2 x 2 patches ([B, (H/2)(W/2), 4C]) with 3-axis position ids, the
T5 sequence as context and CLIP's pooled vector beside the timestep; FLUX.1-dev also embeds a
guidance value (distilled guidance), trained here with ``training.guidance``. One caption's
features are one tensor, so the kit caches and drops captions as for any family: the T5
sequence [L, D] with the pooled CLIP vector as one more row (zero-padded to D).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from mmcore.config import RunConfig
from mmcore import StageContext
from mmcore.data import caption_agreement
from mmcore.engines import RenameAdapter
from mmcore import StageError
from mmcore.kits import DiffusionFamily, GuidanceEmbeddingTraining, SampleExport, VideoData, denoiser_flops, guidance_option, latent_token_ids, pack_latents, unpack_latents

from mm_pack_flux.demo import write_demo_dataset


class FluxData(VideoData):
    """Images as one-frame buckets, sides a multiple of 16 (VAE 8 x packing 2)."""

    size_multiple, size_reason, frame_stride = 16, "VAE 8 x packing 2", 0
    buckets: list[tuple[int, int, int]] = Field(default_factory=lambda: [(32, 32, 1)], description="(height, width, 1) buckets.")


class FluxTraining(GuidanceEmbeddingTraining):
    guidance: float = Field(3.5, ge=0, description="The value the guidance embedding is given in training (FLUX.1-dev; models without the embedding ignore it).")


class FluxConfig(RunConfig):
    data: FluxData = Field(default_factory=FluxData)
    training: FluxTraining = Field(default_factory=FluxTraining)
    export: SampleExport = Field(default_factory=SampleExport)


# The diffusers FLUX transformer trains under its own parameter names.
ADAPTER = RenameAdapter(rules=[])

FREEZE_GROUPS = {
    "double_blocks": ["transformer_blocks.*"],
    "single_blocks": ["single_transformer_blocks.*"],
    "embeddings": ["x_embedder.*", "context_embedder.*", "time_text_embed.*"],
    "head": ["norm_out.*", "proj_out.*"],
}


class Encoders:
    """The frozen VAE, CLIP and T5 of a FLUX checkpoint, used exactly as ``FluxPipeline`` uses them."""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        from diffusers import FluxPipeline

        self.pipe = FluxPipeline.from_pretrained(model_dir, transformer=None)
        for part in (self.pipe.vae, self.pipe.text_encoder, self.pipe.text_encoder_2):
            part.eval()
        self.max_sequence_length = max_sequence_length
        self.shift, self.scale = self.pipe.vae.config.shift_factor or 0.0, self.pipe.vae.config.scaling_factor

    def latents(self, frames: Any) -> Any:
        """uint8 [1, H, W, 3] -> latents [C, H/8, W/8], shifted and scaled as the pipeline expects them."""
        import torch

        with torch.no_grad():
            image = frames[0].permute(2, 0, 1)[None].float() / 127.5 - 1.0
            z = self.pipe.vae.encode(image).latent_dist.mode()
            return ((z - self.shift) * self.scale)[0]

    def text(self, caption: str) -> Any:
        """[L + 1, D]: T5's sequence, then CLIP's pooled vector zero-padded to D."""
        import torch

        with torch.no_grad():
            sequence, pooled, _ = self.pipe.encode_prompt(caption, prompt_2=None, device=torch.device("cpu"), max_sequence_length=self.max_sequence_length)
        width = sequence.shape[-1]
        if pooled.shape[-1] > width:
            raise StageError(f"CLIP's pooled vector ({pooled.shape[-1]}) is wider than T5's states ({width}); this pack stores it beside them")
        row = torch.zeros(1, width, dtype=sequence.dtype)
        row[0, : pooled.shape[-1]] = pooled[0]
        return torch.cat([sequence[0], row])


def denoiser_inputs(model: Any, packed: Any, height: int, width: int, sigma: Any, text: Any, guidance: float) -> dict[str, Any]:
    """The transformer's keyword inputs for packed latents of ``height`` x ``width`` and cached text."""
    import torch

    batch = packed.shape[0]
    pooled = model.config.pooled_projection_dim
    return {
        "hidden_states": packed,
        "timestep": sigma.to(packed.dtype),
        "guidance": torch.full((batch,), guidance, dtype=packed.dtype, device=packed.device) if model.config.guidance_embeds else None,
        "pooled_projections": text[:, -1, :pooled].to(packed.dtype),
        "encoder_hidden_states": text[:, :-1].to(packed.dtype),
        "txt_ids": torch.zeros(text.shape[1] - 1, 3, device=packed.device, dtype=packed.dtype),
        "img_ids": latent_token_ids(1, height // 2, width // 2, packed.device, packed.dtype),  # FluxPipeline's (0, row, column) of its 2x2 patches
    }


def predict(model: Any, noisy: Any, sigma: Any, text: Any, guidance: float = 1.0) -> Any:
    """The velocity for latents [B, C, H, W] at noise levels ``sigma`` (the pipeline's ``timestep / 1000``)."""
    height, width = noisy.shape[-2:]
    out = model(**denoiser_inputs(model, pack_latents(noisy, patch=2), height, width, sigma, text, guidance), return_dict=False)[0]
    return unpack_latents(out, None, height, width, patch=2)


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random 8 x 8 latents and caption features)."""
    import torch

    channels = model.config.in_channels // 4
    width = model.config.joint_attention_dim
    text = torch.randn(1, ctx.config.data.max_sequence_length + 1, width, generator=generator)
    packed = pack_latents(torch.randn(1, channels, 8, 8, generator=generator), patch=2)
    return denoiser_inputs(model, packed, 8, 8, torch.tensor([0.5]), text, ctx.config.training.guidance)


def sample(pipe: Any, ctx: StageContext, prompt: str, generator: Any) -> Any:
    """One image [1, H, W, 3] in [0, 1] (a one-frame video for the kit's writers)."""
    height, width, _ = ctx.config.data.buckets[0]
    return pipe(
        prompt,
        height=height,
        width=width,
        num_inference_steps=ctx.config.export.sample_steps,
        guidance_scale=ctx.config.export.guidance_scale,
        max_sequence_length=ctx.config.data.max_sequence_length,
        generator=generator,
        output_type="np",
        **ctx.config.export.call_options(pipe),  # export.pipeline_options
    ).images[:1]


FAMILY = DiffusionFamily(
    transformer_class="FluxTransformer2DModel",
    pipeline_class="FluxPipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    sample=sample,
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("transformer_blocks", "single_transformer_blocks"),
    demo=write_demo_dataset,
    demo_checker=caption_agreement,
    predict_options=guidance_option,
    # each weight sees every image patch and caption token once (the double blocks keep the
    # streams apart, the single ones join them); joint attention over both; the pooled row is no token
    flops=lambda: denoiser_flops(joint_text=True, layers=("num_layers", "num_single_layers"), side_rows=1),
)
