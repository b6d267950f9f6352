"""HunyuanVideo text-to-video as the diffusion kit sees it: the denoiser and pipeline classes, the
frozen 3D VAE, Llama and CLIP used exactly as ``HunyuanVideoPipeline`` uses them, the denoiser's
call. The kit (:mod:`mmcore.kits.diffusion`) does preprocessing, extract, flow-matching training
and export.

HunyuanVideo reads a caption three ways: the Llama's states at its third-last layer after the
prompt template's prefix is cropped (``encoder_hidden_states``), which of those tokens are real
(``encoder_attention_mask``: the token refiner and the joint attention ignore the padding), and
CLIP's pooled vector beside the timestep (``pooled_projections``), cached as one tensor
(:class:`mm_pack_hunyuanvideo.caption.Layout`). The released model is guidance-distilled: it embeds
the guidance value (``training.guidance``, x 1000 as the pipeline passes it).
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
from mmcore.kits import DiffusionFamily, GuidanceEmbeddingTraining, SampleExport, VideoData, denoiser_flops, guidance_option, text_to_video_sample

from mm_pack_hunyuanvideo.caption import Layout, caption_start


class HunyuanVideoData(VideoData):
    """Buckets as HunyuanVideo's VAE takes them: frames = 4k+1, sides multiples of 16."""

    size_multiple, size_reason, frame_stride = 16, "VAE 8 x patch 2", 4


class HunyuanVideoTraining(GuidanceEmbeddingTraining):
    flow_shift: float = Field(7.0, gt=0, description="Timestep shift of the flow-matching schedule (the release's scheduler: 7).")


class HunyuanVideoConfig(RunConfig):
    data: HunyuanVideoData = Field(default_factory=HunyuanVideoData)
    training: HunyuanVideoTraining = Field(default_factory=HunyuanVideoTraining)
    export: SampleExport = Field(default_factory=lambda: SampleExport(guidance_scale=6.0))  # the pipeline's embedded guidance default


# The diffusers HunyuanVideo transformer trains under its own parameter names.
ADAPTER = RenameAdapter(rules=[])

FREEZE_GROUPS = {
    "double_blocks": ["transformer_blocks.*"],
    "single_blocks": ["single_transformer_blocks.*"],
    "embeddings": ["x_embedder.*", "context_embedder.*", "time_text_embed.*"],
    "head": ["norm_out.*", "proj_out.*"],
}


class Encoders:
    """The frozen 3D VAE, Llama and CLIP of a HunyuanVideo checkpoint, used exactly as
    ``HunyuanVideoPipeline`` uses them (its prompt template, the layer it reads, its crop)."""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        from diffusers import HunyuanVideoPipeline
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

        self.pipe = HunyuanVideoPipeline.from_pretrained(model_dir, transformer=None)
        for part in (self.pipe.vae, self.pipe.text_encoder, self.pipe.text_encoder_2):
            part.eval()
        self.max_sequence_length = max_sequence_length
        self.scale = self.pipe.vae.config.scaling_factor
        # The pipeline cuts a fixed number of tokens (the template's prefix as the release's
        # tokenizer splits it): with another tokenizer the cut would eat into the caption.
        template = DEFAULT_PROMPT_TEMPLATE["template"]
        starts, crop = caption_start(lambda caption: self.pipe.tokenizer(template.format(caption)).input_ids), DEFAULT_PROMPT_TEMPLATE["crop_start"]
        if starts != crop:
            raise StageError(
                f"{model_dir / 'tokenizer'}: splits HunyuanVideoPipeline's prompt template so the caption starts at token {starts}, "
                f"but the pipeline crops {crop}: captions would lose or keep template tokens; use the release's tokenizer"
            )
        self.layout = layout(max_sequence_length, self.pipe.text_encoder.config.hidden_size, self.pipe.text_encoder_2.config.hidden_size)

    def latents(self, frames: Any) -> Any:
        """uint8 (F, H, W, 3) -> latents (16, F', H', W'), the mode of the VAE's posterior times
        its ``scaling_factor`` (the pipeline decodes ``latents / scaling_factor``)."""
        import torch

        with torch.no_grad():
            video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
            return (self.pipe.vae.encode(video).latent_dist.mode() * self.scale)[0]

    def text(self, caption: str) -> Any:
        """The Llama's states, CLIP's pooled vector and the token mask, as one tensor."""
        import torch

        with torch.no_grad():
            states, pooled, mask = self.pipe.encode_prompt(caption, device=torch.device("cpu"), max_sequence_length=self.max_sequence_length)
        return self.layout.join([states[0]], [pooled[0], mask[0]])


def layout(tokens: int, width: int, pooled: int) -> Layout:
    """A cached caption: ``tokens`` Llama states of ``width``; CLIP's ``pooled`` vector, the mask."""
    return Layout(sequences=[(tokens, width)], vectors=[pooled, tokens])


def caption_tokens(rows: int, config: Any) -> int:
    """The Llama tokens in a cached caption of ``rows`` rows (rows grow with tokens, so one fits)."""
    import math

    return next(n for n in range(rows, 0, -1) if n + math.ceil((config.pooled_projection_dim + n) / config.text_embed_dim) == rows)


def predict(model: Any, noisy: Any, sigma: Any, text: Any, guidance: float = 1.0) -> Any:
    """The velocity for latents [B, C, F, H, W] at noise levels ``sigma`` (the pipeline's ``timestep / 1000``)."""
    import torch

    config = model.config
    (states,), (pooled, mask) = layout(caption_tokens(text.shape[1], config), config.text_embed_dim, config.pooled_projection_dim).split(text.to(noisy.dtype))
    embedded = torch.full((noisy.shape[0],), guidance * 1000.0, dtype=noisy.dtype, device=noisy.device) if model.config.guidance_embeds else None
    return model(hidden_states=noisy, timestep=sigma * 1000, encoder_hidden_states=states, encoder_attention_mask=mask, pooled_projections=pooled, guidance=embedded, return_dict=False)[0]


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random latents and caption features, every token real)."""
    import torch

    length = ctx.config.data.max_sequence_length
    return {
        "hidden_states": torch.randn(1, model.config.in_channels, 2, 4, 4, generator=generator),
        "timestep": torch.tensor([500.0]),
        "encoder_hidden_states": torch.randn(1, length, model.config.text_embed_dim, generator=generator),
        "encoder_attention_mask": torch.ones(1, length),
        "pooled_projections": torch.randn(1, model.config.pooled_projection_dim, generator=generator),
        "guidance": torch.tensor([1000.0]) if model.config.guidance_embeds else None,
    }


FAMILY = DiffusionFamily(
    transformer_class="HunyuanVideoTransformer3DModel",
    pipeline_class="HunyuanVideoPipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    sample=text_to_video_sample,
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("transformer_blocks", "single_transformer_blocks"),
    demo=write_moving_shapes,
    demo_checker=caption_agreement,
    predict_options=guidance_option,
    # the double-stream blocks keep caption and video apart, the single-stream ones join them:
    # each weight sees every token once either way, and attention runs over both
    flops=lambda: denoiser_flops(joint_text=True, layers=("num_layers", "num_single_layers"), side_rows=lambda model, rows: rows - caption_tokens(rows, model.config)),
)
