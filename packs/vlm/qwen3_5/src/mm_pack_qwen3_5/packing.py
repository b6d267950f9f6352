"""Packed rows through Qwen3.5's linear-attention layers: each sample on its own.

A Gated DeltaNet layer carries a recurrent state along the row and, before it, a causal
depthwise convolution (kernel 4) over the last tokens. transformers' torch path
(``torch_chunk_gated_delta_rule``, ``causal_conv1d_fn``) takes no sample boundaries: a
``cu_seq_lens_q`` keyword, which the layer hands on when a caller passes one, is read only by the
fla kernels (the torch functions, the convolution's included, drop it), and the text model
hands the linear-attention layers no positions at all. A packed row would carry each sample's
state and convolution window into the next sample (the tests' control shows it).

:func:`isolate_linear_attention` keeps them apart: a pre-hook on the text model reads the
sample boundaries from the restarting text positions of the packed row (row 0 of the
``[4, 1, T]`` positions, as the full-attention layers' varlen kernel does) and every
linear-attention layer runs once per sample, the outputs concatenated. Everything the layer
does per token (projections, gates, norm) is unchanged, so the row equals each sample alone.
Rows that are not packed (padded batches, generation with a cache) go through unchanged.
"""

from __future__ import annotations

from typing import Any


def isolate_linear_attention(model: Any) -> None:
    """Make ``model``'s (``Qwen3_5ForConditionalGeneration``) Gated DeltaNet layers run a packed
    row sample by sample."""
    from mmcore.attention import segment_bounds

    text = model.model.language_model
    seen: dict[str, Any] = {"bounds": None}

    def read_bounds(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        positions = kwargs.get("position_ids")
        if positions is not None and positions.ndim == 3:
            positions = positions[0]  # text positions first ([4, 1, T]); M-RoPE axes after
        seen["bounds"] = segment_bounds(positions)

    text.register_forward_pre_hook(read_bounds, with_kwargs=True)
    for layer in text.layers:
        if getattr(layer, "block_type", None) == "linear_attention":
            layer.linear_attn.forward = _per_sample(layer.linear_attn.forward, seen)


def _per_sample(forward: Any, seen: dict[str, Any]) -> Any:
    import torch

    def run(hidden_states: Any, cache: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
        bounds = seen["bounds"]
        if bounds is None or cache is not None or hidden_states.shape[0] != 1:
            return forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        edges = [int(b) for b in bounds.tolist()]
        parts = []
        for start, end in zip(edges[:-1], edges[1:]):
            mask = attention_mask[:, start:end] if attention_mask is not None else None
            parts.append(forward(hidden_states[:, start:end], cache=None, attention_mask=mask, **kwargs))
        return torch.cat(parts, dim=1)

    return run


__all__ = ["isolate_linear_attention"]
