"""Open-Sora Plan v1.5 text-to-video as the diffusion kit sees it: the pack's own denoiser and
pipeline classes (diffusers has none), the frozen VAE, T5 and CLIP used exactly as
``OpenSoraPlanPipeline`` uses them, the denoiser's call. The kit (:mod:`mmcore.kits.diffusion`)
does preprocessing, extract, flow-matching training and export.

One caption's features are one tensor, so the kit caches and drops captions as for any family:
T5's sequence [L, D], then CLIP's pooled vector as one more row, then T5's attention mask as
the last (both zero-padded to D).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore import StageContext, StageError
from mmcore.data import caption_agreement, write_moving_shapes
from mmcore.kits import DiffusionFamily, text_to_video_sample

from mm_pack_opensoraplan.adapter import ADAPTER

FREEZE_GROUPS = {
    "blocks": ["transformer_blocks.*"],
    "skips": ["skip_norm_linear.*", "skip_norm_linear_enc.*"],
    "embeddings": ["patch_embed.*", "time_text_embed.*", "caption_projection.*"],
    "head": ["proj_out.*", "norm_out.*", "norm_final.*"],
}


def pack_text(states: Any, mask: Any, pooled: Any) -> Any:
    """[L + 2, D]: T5's states, CLIP's pooled vector, T5's mask (rows zero-padded to D)."""
    import torch

    length, width = states.shape
    if pooled.shape[-1] > width or length > width:
        raise StageError(f"CLIP's pooled vector ({pooled.shape[-1]}) or the text length ({length}) exceeds T5's width ({width}); this pack stores them beside its states")
    rows = torch.zeros(2, width, dtype=states.dtype)
    rows[0, : pooled.shape[-1]] = pooled
    rows[1, :length] = mask.to(states.dtype)
    return torch.cat([states, rows])


def unpack_text(text: Any, pooled_dim: int) -> tuple[Any, Any, Any]:
    """Batched [B, L + 2, D] -> (states [B, L, D], mask [B, L], pooled [B, P])."""
    length = text.shape[1] - 2
    return text[:, :length], text[:, -1, :length] > 0.5, text[:, -2, :pooled_dim]


class Encoders:
    """The frozen VAE, T5 and CLIP of the pipeline folder, through the pipeline's own methods."""

    def __init__(self, model_dir: Path, max_sequence_length: int) -> None:
        from mm_pack_opensoraplan.pipeline import OpenSoraPlanPipeline

        self.pipe = OpenSoraPlanPipeline.from_pretrained(model_dir, transformer=None)
        for part in (self.pipe.vae, self.pipe.text_encoder, self.pipe.text_encoder_2):
            part.eval()
        from mm_pack_opensoraplan.wfvae import WFVAEModel

        if isinstance(self.pipe.vae, WFVAEModel) and self.pipe.vae.config.norm_type != "groupnorm":
            self.pipe.vae.enable_tiling(8)  # the reference's chunks: the same latents at a lower memory peak
        self.max_sequence_length = max_sequence_length

    def latents(self, frames: Any) -> Any:
        """uint8 (F, H, W, 3) -> normalised latents (C, F', H', W'), as the pipeline decodes them."""
        import torch

        t_scale, s_scale = self.pipe.vae_scales()
        side = 2 * s_scale
        if (frames.shape[0] - 1) % t_scale:
            raise StageError(f"bucket of {frames.shape[0]} frames: the VAE compresses {t_scale}x in time after the first frame: frames must be {t_scale}k + 1 (data.buckets)")
        if frames.shape[1] % side or frames.shape[2] % side:
            raise StageError(
                f"bucket {frames.shape[1]}x{frames.shape[2]}: the VAE compresses {side // 2}x and the transformer patches 2x2 latents: height and width must be multiples of {side} (data.buckets)"
            )
        video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
        with torch.no_grad():
            return self.pipe.encode_video(video)[0]

    def text(self, caption: str) -> Any:
        import torch

        states, mask, pooled = self.pipe.encode_prompt(caption, self.max_sequence_length, device=torch.device("cpu"))
        return pack_text(states[0], mask[0], pooled[0])


def predict(model: Any, noisy: Any, sigma: Any, text: Any) -> Any:
    """The velocity at noise levels ``sigma`` (timestep = 1000 sigma, as the reference trains)."""
    states, mask, pooled = unpack_text(text, model.config.pooled_projection_dim)
    return model(noisy, sigma * 1000, states, pooled, encoder_attention_mask=mask, return_dict=False)[0]


def probe(model: Any, ctx: StageContext, generator: Any) -> dict[str, Any]:
    """One small denoiser call's inputs (random latents and text states)."""
    import torch

    c = model.config
    length = ctx.config.data.max_sequence_length
    mask = torch.ones(1, length, dtype=torch.bool)
    mask[:, length // 2 :] = False
    return {
        "hidden_states": torch.randn(1, c.in_channels, 3, 4, 4, generator=generator),
        "timestep": torch.tensor([500.0]),
        "encoder_hidden_states": torch.randn(1, length, c.caption_channels, generator=generator),
        "pooled_projections": torch.randn(1, c.pooled_projection_dim, generator=generator),
        "encoder_attention_mask": mask,
    }


def flops() -> Any:
    """``(model, batch) -> FLOPs`` of a step: the weights on every video and text token; in a block
    of ``sparse_n`` k, attention within each of the k groups (a k-th of the video and the text)."""
    import math

    from mmcore.train import StepFlops, attention_flops, dense_flops

    seen = StepFlops()

    def count(model: Any, batch: dict[str, Any]) -> float:
        c = model.config
        samples, _, frames, height, width = batch["latents"].shape
        tokens, caption = frames * (height // c.patch_size_thw[1]) * (width // c.patch_size_thw[2]), batch["text"].shape[1] - 2
        total = dense_flops(seen.counts("", model), samples * (tokens + caption))
        for blocks, k in zip(c.num_layers, model.sparse):
            total += attention_flops(blocks, c.num_heads * c.head_dim, [math.ceil(tokens / k) + caption] * (samples * k))
        return total

    return count


class OpenSoraPlanFamily(DiffusionFamily):
    """The kit's family with the pack's classes where it looks up diffusers'."""

    def diffusers_class(self, name: str) -> Any:
        import mm_pack_opensoraplan

        return getattr(mm_pack_opensoraplan, name) if name.startswith("OpenSoraPlan") else super().diffusers_class(name)


FAMILY = OpenSoraPlanFamily(
    transformer_class="OpenSoraPlanTransformer3DModel",
    pipeline_class="OpenSoraPlanPipeline",
    adapter=ADAPTER,
    encoders=Encoders,
    predict=predict,
    probe=probe,
    sample=text_to_video_sample,
    freeze_groups=FREEZE_GROUPS,
    flops=flops,
    shard_layers=("blocks",),  # the model's flat list of its stages' blocks
    demo=write_moving_shapes,
    demo_checker=caption_agreement,
)
