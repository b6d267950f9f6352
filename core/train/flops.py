"""FLOPs of a training step, for the ``tflops`` and ``mfu`` metrics.

The usual transformer estimate (PaLM appendix B, torchtitan): a token through a weight matrix of
``n`` parameters costs ``2n`` FLOPs forward and ``4n`` backward, so ``6n`` where the weight
trains. A frozen weight is counted forward only (``2n``), exact for a frozen tower below every
trained weight, an undercount by ``2n`` for a frozen block with trained ones below it.
Embedding lookups cost nothing (an output layer tied to the embedding is a matmul and counts). Attention adds ``12 * layers * width * s^2`` per sequence of
``s`` tokens (QK^T and AV, forward and backward, causal masking not discounted); a packed row
counts each sample's ``s_i^2``, not ``T^2``.
"""

from __future__ import annotations

from typing import Any, Iterable


def parameter_counts(module: Any) -> tuple[int, int]:
    """(trained, frozen) parameter counts of ``module``, embeddings left out (global counts
    of sharded parameters)."""
    from torch import nn

    # a lookup costs nothing, but an output layer tied to the embedding is a matmul: count it
    used_elsewhere = {id(p) for m in module.modules() if not isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    embedding = {id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)} - used_elsewhere
    trained = frozen = 0
    for param in module.parameters():
        if id(param) in embedding:
            continue
        if param.requires_grad:
            trained += param.numel()
        else:
            frozen += param.numel()
    return trained, frozen


def dense_flops(counts: tuple[int, int], tokens: float) -> float:
    trained, frozen = counts
    return (6.0 * trained + 2.0 * frozen) * tokens


def attention_flops(layers: int, width: int, lengths: Iterable[float], other: Iterable[float] | None = None) -> float:
    """Self-attention over sequences of ``lengths``; with ``other``, cross-attention from each
    to the matching ``other`` length (a decoder reading its encoder, a denoiser its caption)."""
    lengths = [float(n) for n in lengths]
    pairs = zip(lengths, other) if other is not None else ((n, n) for n in lengths)
    return 12.0 * layers * width * sum(q * float(k) for q, k in pairs)


class StepFlops:
    """Parameter counts measured once (they do not change during training), per-batch FLOPs after."""

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, int]] = {}

    def counts(self, key: str, module: Any) -> tuple[int, int]:
        if key not in self._counts:
            self._counts[key] = parameter_counts(module)
        return self._counts[key]


def utilisation(flops: float, seconds: float, peak: float | None) -> dict[str, float]:
    """Achieved TFLOP/s of this process, and the model FLOPs utilisation where the device's
    ``peak`` FLOP/s is known (``Accelerator.peak_flops()``, asked once a run)."""
    achieved = flops / max(seconds, 1e-9)
    out = {"tflops": achieved / 1e12}
    if peak:
        out["mfu"] = achieved / peak
    return out


__all__ = ["parameter_counts", "dense_flops", "attention_flops", "StepFlops", "utilisation"]
