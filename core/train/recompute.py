"""Activation recompute, applied from outside to the blocks a recipe names.

``training.recompute``:

* ``none``: every activation is kept for the backward pass.
* ``full``: each block keeps only its inputs; its forward runs again during backward.
* ``selective``: each block keeps the outputs of its expensive ops (matrix multiplies and
  attention) and recomputes the cheap ones (norms, activations, rotary, residual adds), as
  torchtitan's op-level policy does: most of the memory of ``full``'s saving for little of its
  time.

Both use PyTorch's non-reentrant checkpoint, so losses and gradients are the same as without
recompute (the same ops on the same inputs). The block's ``forward`` is wrapped in place: its
parameter names do not change, and a backend shards it afterwards as any other module.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

MODES = ("none", "full", "selective")


#: the aten ops whose outputs ``selective`` keeps: matrix multiplies and attention kernels
KEPT_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)


def _kept_ops(names: Sequence[str]) -> set[Any]:
    import torch

    aten = torch.ops.aten
    ops = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            ops.update(getattr(packet, overload) for overload in packet.overloads())
    return ops


def _selective_context(names: Sequence[str]) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    kept = _kept_ops(names)

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _recomputed(forward: Callable[..., Any], mode: str, kept_ops: Sequence[str]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    extra = {"context_fn": functools.partial(_selective_context, kept_ops)} if mode == "selective" else {}

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return run


def apply_recompute(blocks: Sequence[Any], mode: str, kept_ops: Sequence[str] = KEPT_OPS) -> int:
    """Wrap each block's forward for ``mode``; returns how many blocks were wrapped.
    ``kept_ops``: the aten ops (by name) whose outputs ``selective`` keeps."""
    if mode not in MODES:
        raise ValueError(f"training.recompute must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "none":
        return 0
    for block in blocks:
        block.forward = _recomputed(block.forward, mode, kept_ops)
    return len(blocks)


__all__ = ["MODES", "KEPT_OPS", "apply_recompute"]
