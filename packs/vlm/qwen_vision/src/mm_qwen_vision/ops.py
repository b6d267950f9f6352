"""Qwen text kernels (RMSNorm, rotary), shared by the Qwen VL packs; see ``mm_qwen_vision.kernels``. Device libraries are imported inside each function."""

from __future__ import annotations

from typing import Any


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """Qwen2's RMSNorm: normalise in fp32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * (h.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return weight * h.to(dtype)


def rms_norm_npu(x: Any, weight: Any, eps: float = 1e-6) -> Any:  # pragma: no cover - needs an NPU
    import torch_npu

    return torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary position embedding, rotate-half convention (cos/sin broadcast against ``x``)."""
    return x * cos + _rotate_half(x) * sin


def apply_rotary_npu(x: Any, cos: Any, sin: Any) -> Any:  # pragma: no cover - needs an NPU
    import torch_npu

    return torch_npu.npu_rotary_mul(x, cos, sin)


# Example inputs for the conformance suite's parity check of each implementation against the
# reference (KernelSpec.example): small, fixed-seed, bf16 where the model runs bf16.


def rms_norm_example() -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 5, 64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16(), 1e-6


def rotary_example() -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(0)
    angles = torch.randn(1, 1, 7, 8, generator=g)
    return torch.randn(1, 4, 7, 16, generator=g), torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
