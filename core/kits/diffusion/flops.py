"""The FLOPs of a diffusion transformer's training step, for the ``tflops`` and ``mfu`` metrics."""

from __future__ import annotations

from typing import Any, Callable, Sequence


def denoiser_flops(joint_text: bool = False, layers: Sequence[str] = ("num_layers",), side_rows: int | Callable[[Any, int], int] = 0) -> Callable[[Any, dict[str, Any]], float]:
    """``(model, batch) -> FLOPs`` of a diffusion transformer's step on latents [B, C, F, H, W]
    (or [B, C, H, W]): its weights on every patch token, self-attention over each sample's
    tokens, cross-attention to the caption (config: ``patch_size`` (and ``patch_size_t``),
    ``num_attention_heads`` x ``attention_head_dim``, as diffusers' transformers name them).
    ``joint_text``: the caption's tokens join the image's in one sequence (CogVideoX, FLUX,
    HunyuanVideo) instead: the weights see them too and attention runs over both. ``layers``:
    the config's block counts (FLUX and HunyuanVideo: double- and single-stream).
    ``side_rows``: rows of the cached text that are not tokens (a pooled vector, a mask), or
    ``(model, rows) -> that count``."""
    import math

    from mmcore.train.flops import StepFlops, attention_flops, dense_flops

    seen = StepFlops()

    def flops(model: Any, batch: dict[str, Any]) -> float:
        config = model.config
        patch = config.patch_size if isinstance(config.patch_size, (tuple, list)) else (getattr(config, "patch_size_t", None) or 1, config.patch_size, config.patch_size)
        samples, _, *grid = batch["latents"].shape
        tokens = math.prod(n // p for n, p in zip(grid, patch[-len(grid) :]))
        width = config.num_attention_heads * config.attention_head_dim
        rows = batch["text"].shape[1]
        caption = rows - (side_rows(model, rows) if callable(side_rows) else side_rows)
        blocks = sum(getattr(config, name) for name in layers)
        if joint_text:
            return dense_flops(seen.counts("", model), samples * (tokens + caption)) + attention_flops(blocks, width, [tokens + caption] * samples)
        return dense_flops(seen.counts("", model), samples * tokens) + attention_flops(blocks, width, [tokens] * samples) + attention_flops(blocks, width, [tokens] * samples, [caption] * samples)

    return flops


__all__ = ["denoiser_flops"]
