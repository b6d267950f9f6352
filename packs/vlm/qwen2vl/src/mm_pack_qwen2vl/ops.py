"""Kernel implementations (see ``kernels.py``). Device libraries are imported inside each function."""

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


def _expand_kv(k: Any, heads: int) -> Any:
    return k if k.shape[1] == heads else k.repeat_interleave(heads // k.shape[1], dim=1)


def varlen_attention(q: Any, k: Any, v: Any, cu_seqlens: Any, causal: bool = True, scale: float | None = None) -> Any:
    """Attention over packed sequences (TND: tokens, heads, dim), each attending only to itself.

    ``cu_seqlens`` holds the cumulative lengths ``[0, n1, n1+n2, ...]``.
    """
    import torch
    import torch.nn.functional as F

    total, heads, _ = q.shape
    seq = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1, device=q.device), (cu_seqlens[1:] - cu_seqlens[:-1]).to(q.device))
    allowed = seq[:, None] == seq[None, :]
    if causal:
        allowed &= torch.ones(total, total, dtype=torch.bool, device=q.device).tril()
    k, v = _expand_kv(k, heads), _expand_kv(v, heads)
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=allowed, scale=scale)
    return out[0].transpose(0, 1)


def varlen_attention_flash(q: Any, k: Any, v: Any, cu_seqlens: Any, causal: bool = True, scale: float | None = None) -> Any:  # pragma: no cover - needs flash-attn
    from flash_attn import flash_attn_varlen_func

    cu = cu_seqlens.to(q.device, dtype=__import__("torch").int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal, softmax_scale=scale)


def varlen_attention_npu(q: Any, k: Any, v: Any, cu_seqlens: Any, causal: bool = True, scale: float | None = None) -> Any:  # pragma: no cover - needs an NPU
    import torch
    import torch_npu

    heads, dim = q.shape[1], q.shape[2]
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=q.device), diagonal=1) if causal else None
    ends = cu_seqlens[1:].tolist()
    return torch_npu.npu_fusion_attention(
        q, k, v, heads, input_layout="TND", scale=scale if scale is not None else dim**-0.5,
        atten_mask=mask, sparse_mode=3 if causal else 0, actual_seq_qlen=ends, actual_seq_kvlen=ends,
    )[0]


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


def varlen_attention_example() -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 4, 32, generator=g).bfloat16() for _ in range(3))
    return q, k, v, torch.tensor([0, 5, 12], dtype=torch.int32)
