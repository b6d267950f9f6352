"""Packed attention for transformers decoders: samples back to back in one row, each attending
only to itself, without a T x T mask.

transformers builds a block-diagonal ``T x T`` mask for a packed row under ``sdpa`` (memory
O(T^2) per row: 1 GiB of booleans at 32k tokens, per layer in flight). Here the decoder's
attention goes through the device's registered ``varlen_attention`` kernel instead, given the
samples' boundaries (``cu_seqlens``) read from the restarting positions transformers already
hands every attention call: flash-attn's varlen kernel on CUDA, ``npu_fusion_attention`` (TND)
on NPU, and on the CPU a reference that runs each sample through SDPA on its own (memory
O(sum of s_i^2), never O(T^2)).

:func:`use_packed_attention` switches a model's text decoder to it. Everything that is not a
packed row (padded rows with a mask, generation with a cache) goes to transformers' own SDPA
function unchanged. The decoder's mask must be causal: families whose text mask is not (image
tokens attending both ways, as in Gemma 3) do not use it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

IMPLEMENTATION = "mmcore_varlen"


# --------------------------------------------------------------------------- the kernels (TND)


def _expand_kv(t: Any, heads: int) -> Any:
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def varlen_attention(q: Any, k: Any, v: Any, cu_seqlens: Any, causal: bool = True, scale: float | None = None) -> Any:
    """Reference: attention over packed sequences (TND: tokens, heads, dim), each sequence on its
    own through SDPA. ``cu_seqlens`` holds the cumulative lengths ``[0, n1, n1+n2, ...]``;
    key/value may have fewer heads than the query (grouped-query attention)."""
    import torch
    import torch.nn.functional as F

    heads = q.shape[1]
    bounds = [int(b) for b in cu_seqlens.tolist()]
    parts = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs = q[start:end].transpose(0, 1)[None]
        ks = _expand_kv(k[start:end], heads).transpose(0, 1)[None]
        vs = _expand_kv(v[start:end], heads).transpose(0, 1)[None]
        parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)[0].transpose(0, 1))
    return torch.cat(parts) if parts else q.new_empty(q.shape)


def varlen_attention_flash(q: Any, k: Any, v: Any, cu_seqlens: Any, causal: bool = True, scale: float | None = None) -> Any:  # pragma: no cover - needs flash-attn
    import torch
    from flash_attn import flash_attn_varlen_func

    cu = cu_seqlens.to(q.device, dtype=torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal, softmax_scale=scale)


def varlen_attention_npu(q: Any, k: Any, v: Any, cu_seqlens: Any, causal: bool = True, scale: float | None = None) -> Any:  # pragma: no cover - needs an NPU
    import torch
    import torch_npu

    heads, dim = q.shape[1], q.shape[2]
    # sparse_mode 3 (causal, bottom-right aligned) takes this fixed 2048 x 2048 compressed mask.
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=q.device), diagonal=1) if causal else None
    ends = [int(e) for e in cu_seqlens[1:].tolist()]
    return torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        heads,
        input_layout="TND",
        scale=scale if scale is not None else dim**-0.5,
        atten_mask=mask,
        sparse_mode=3 if causal else 0,
        actual_seq_qlen=ends,
        actual_seq_kvlen=ends,
    )[0]


def varlen_attention_example() -> tuple[Any, ...]:
    """Sample arguments for the parity check (bf16, two sequences, grouped-query heads)."""
    import torch

    g = torch.Generator().manual_seed(0)
    q = torch.randn(12, 4, 32, generator=g).bfloat16()
    k, v = (torch.randn(12, 2, 32, generator=g).bfloat16() for _ in range(2))
    return q, k, v, torch.tensor([0, 5, 12], dtype=torch.int32)


# --------------------------------------------------------------------------- transformers' side


def segment_bounds(position_ids: Any) -> Any | None:
    """``cu_seqlens`` of a packed row from its restarting positions ([1, T]), or None when the
    row holds one sequence."""
    import torch

    if position_ids is None or position_ids.ndim != 2 or position_ids.shape[0] != 1:
        return None
    positions = position_ids[0]
    starts = torch.nonzero(positions[1:] - positions[:-1] != 1).flatten() + 1
    if starts.numel() == 0:
        return None
    total = torch.tensor([positions.shape[0]], device=starts.device)
    return torch.cat([starts.new_zeros(1), starts, total])


def packed_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    *,
    kernel: Callable[..., Any],
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: Any = None,
    packed_position_ids: Any = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function contract (``query`` [B, H, T, D] -> [B, T, H, D]).

    ``packed_position_ids``: the positions, for an attention module whose ``forward`` takes
    ``position_ids`` itself and does not hand them on (Chameleon's); its pack passes them under
    this name (a forward pre-hook adding the keyword), and they count as ``position_ids``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = position_ids if position_ids is not None else packed_position_ids

    bounds = segment_bounds(position_ids) if attention_mask is None and query.shape[2] == key.shape[2] else None
    if bounds is None:
        if attention_mask is None and position_ids is not None and position_ids.ndim == 2 and position_ids.shape[0] > 1 and segment_bounds(position_ids[:1]) is not None:
            raise ValueError("packed attention takes one packed row per batch (several rows with restarting positions and no mask)")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, position_ids=position_ids, **kwargs)
    if dropout:
        raise ValueError(f"packed attention has no dropout (attention_dropout={dropout}); set it to 0 or train without packing")
    if kwargs.get("sliding_window") is not None:
        raise ValueError("packed attention has no sliding window; train this model without packing")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # TND
    out = kernel(q, k, v, bounds.to(q.device), causal=getattr(module, "is_causal", True), scale=scaling)
    return out[None], None


def _mask(*args: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
    """No mask where the row has no padding (packed or a single sequence: the attention function
    knows from the positions); transformers' SDPA mask where it has."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def use_packed_attention(model: Any, kernel: Callable[..., Any], name: str = IMPLEMENTATION) -> str:
    """Run ``model``'s text decoder attention through ``kernel`` (a ``varlen_attention``); returns
    the attention implementation's name (registered with transformers under ``name``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, functools.partial(packed_attention_forward, kernel=kernel))
    AttentionMaskInterface.register(name, _mask)
    model.config.get_text_config()._attn_implementation = name
    return name


__all__ = ["IMPLEMENTATION", "varlen_attention", "varlen_attention_flash", "varlen_attention_npu", "segment_bounds", "packed_attention_forward", "use_packed_attention"]
