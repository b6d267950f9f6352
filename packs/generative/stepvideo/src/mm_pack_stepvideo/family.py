"""Step-Video-T2V text-to-video as the diffusion kit sees it: the pack's own denoiser and pipeline
classes (diffusers has none), the frozen VAE, Step-LLM (stand-in) and HunyuanCLIP used exactly as
``StepVideoPipeline`` uses them, the denoiser's call. The kit (:mod:`mmcore.kits.diffusion`) does
preprocessing, extract, flow-matching training and export.

One caption's features are one tensor, so the kit caches and drops captions as for any family:
Step-LLM's states [L, D], then HunyuanCLIP's states [L2, D2] zero-padded to D, then Step-LLM's
mask as one row, then a row holding L.

The reference's flow runs from noise (time 0) to data (time 1) and predicts ``data - noise``;
the kit's noise level ``sigma`` is ``1 - time`` and its target ``noise - data``, so
:func:`predict` calls the transformer at ``1 - sigma`` and negates its output: the released
weights are trained and sampled as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore import StageContext, StageError
from mmcore.data import caption_agreement, write_moving_shapes
from mmcore.kits import DiffusionFamily, text_to_video_sample

from mm_pack_stepvideo.adapter import ADAPTER

FREEZE_GROUPS = {
    "blocks": ["transformer_blocks.*"],
    "embeddings": ["pos_embed.*", "adaln_single.*", "caption_projection.*", "clip_projection.*"],
    "head": ["proj_out.*", "scale_shift_table"],
}


def pack_text(states: Any, mask: Any, clip: Any) -> Any:
    """[L + L2 + 2, D]: Step-LLM's states, HunyuanCLIP's states, Step-LLM's mask, L (rows zero-padded to D)."""
    import torch

    length, width = states.shape
    if clip.shape[-1] > width or length > width:
        raise StageError(f"HunyuanCLIP's width ({clip.shape[-1]}) or the text length ({length}) exceeds Step-LLM's width ({width}); this pack stores them beside its states")
    rows = torch.zeros(clip.shape[0] + 2, width, dtype=states.dtype)
    rows[:-2, : clip.shape[-1]] = clip
    rows[-2, :length] = mask.to(states.dtype)
    rows[-1, 0] = length
    return torch.cat([states, rows])


def unpack_text(text: Any, clip_dim: int) -> tuple[Any, Any, Any]:
    """Batched [B, L + L2 + 2, D] -> (Step-LLM states [B, L, D], the transformer's mask [B, L2 + L]
    (CLIP's ones first), HunyuanCLIP states [B, L2, D2])."""
    import torch

    length = int(text[0, -1, 0])
    states, clip, mask = text[:, :length], text[:, length:-2, :clip_dim], text[:, -2, :length] > 0.5
    full = torch.cat([torch.ones(mask.shape[0], clip.shape[1], dtype=torch.bool, device=mask.device), mask], dim=1)
    return states, full, clip


class Encoders:
    """The frozen VAE, Step-LLM and HunyuanCLIP of the pipeline folder, through the pipeline's own methods."""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        from mm_pack_stepvideo.pipeline import StepVideoPipeline

        self.pipe = StepVideoPipeline.from_pretrained(model_dir, transformer=None)
        for part in (self.pipe.vae, self.pipe.text_encoder, self.pipe.text_encoder_2):
            part.eval()
        self.max_sequence_length = max_sequence_length

    def latents(self, frames: Any) -> Any:
        """uint8 (F, H, W, 3) -> normalised latents (C, F', H', W'), as the pipeline decodes them."""
        import torch

        side = self.pipe.vae_scales()[1]
        if frames.shape[1] % side or frames.shape[2] % side:
            raise StageError(f"bucket {frames.shape[1]}x{frames.shape[2]}: the VAE compresses {side}x: height and width must be multiples of {side} (data.buckets)")
        group = getattr(self.pipe.vae, "latent_len", None) and self.pipe.vae.config.frame_len
        if group and frames.shape[0] % group:
            raise StageError(f"bucket of {frames.shape[0]} frames: Step-Video's VAE encodes groups of {group} frames: frames must be a multiple of {group} (data.buckets)")
        t_scale = self.pipe.vae_scales()[0]
        if not group and (frames.shape[0] - 1) % t_scale:
            raise StageError(f"bucket of {frames.shape[0]} frames: the VAE compresses {t_scale}x in time after the first frame: frames must be {t_scale}k + 1 (data.buckets)")
        video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
        with torch.no_grad():
            return self.pipe.encode_video(video)[0]

    def text(self, caption: str) -> Any:
        import torch

        states, mask, clip = self.pipe.encode_prompt(caption, self.max_sequence_length, device=torch.device("cpu"))
        return pack_text(states[0], mask[0], clip[0])


def clip_dim(model: Any) -> int:
    channels = model.config.caption_channels
    return channels if isinstance(channels, int) else channels[1]


def predict(model: Any, noisy: Any, sigma: Any, text: Any) -> Any:
    """The kit's velocity (noise - data) at noise levels ``sigma``: minus the transformer's at time ``1 - sigma``."""
    states, mask, clip = unpack_text(text, clip_dim(model))
    return -model(noisy, 1.0 - sigma, states, clip, mask, return_dict=False)[0]


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random latents and text states)."""
    import torch

    c = model.config
    llm, clip = (c.caption_channels, 0) if isinstance(c.caption_channels, int) else c.caption_channels
    length = ctx.config.data.max_sequence_length
    mask = torch.ones(1, 4 + length, dtype=torch.bool)
    mask[:, 4 + length // 2 :] = False
    p = c.patch_size
    return {
        "hidden_states": torch.randn(1, c.in_channels, 3, 2 * p, 2 * p, generator=generator),
        "timestep": torch.tensor([0.5]),
        "encoder_hidden_states": torch.randn(1, length, llm, generator=generator),
        "encoder_hidden_states_2": torch.randn(1, 4, clip, generator=generator) if clip else None,
        "encoder_attention_mask": mask if clip else mask[:, 4:],
    }


def flops() -> Any:
    """``(model, batch) -> FLOPs`` of a step: the weights on every video token (the caption
    projections on the text), self-attention over all video tokens, cross-attention to the text."""
    from mmcore.train import StepFlops, attention_flops, dense_flops

    seen = StepFlops()

    def count(model: Any, batch: dict[str, Any]) -> float:
        c = model.config
        samples, _, frames, height, width = batch["latents"].shape
        tokens = frames * (height // c.patch_size) * (width // c.patch_size)
        caption = batch["text"].shape[1] - 2
        dim = c.num_attention_heads * c.attention_head_dim
        total = dense_flops(seen.counts("", model), samples * tokens)
        total += attention_flops(c.num_layers, dim, [tokens] * samples)
        total += 4.0 * 3 * c.num_layers * samples * tokens * caption * dim  # cross-attention scores and values, forward and backward
        return total

    return count


class StepVideoFamily(DiffusionFamily):
    """The kit's family with the pack's classes where it looks up diffusers'."""

    def diffusers_class(self, name: str) -> Any:
        import mm_pack_stepvideo

        return getattr(mm_pack_stepvideo, name) if name.startswith("StepVideo") else super().diffusers_class(name)


FAMILY = StepVideoFamily(
    transformer_class="StepVideoTransformer3DModel",
    pipeline_class="StepVideoPipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    sample=text_to_video_sample,
    freeze_groups=FREEZE_GROUPS,
    flops=flops,
    shard_layers=("transformer_blocks",),
    demo=write_moving_shapes,
    demo_checker=caption_agreement,
)
