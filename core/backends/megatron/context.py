"""Context parallelism on megatron-core (``parallel.context_parallel``): the sequence of every
sample split over a group of processes, each running the whole model on its part of the tokens.

Megatron's load-balanced split: the (padded) sequence is cut into 2 x CP equal chunks and rank r
of the context-parallel group holds chunks r and 2 x CP - 1 - r, so that under a causal mask every
rank has the same attention work (an early chunk attends to few keys, its late partner to many).
Everything but attention is per token and runs on the rank's own tokens; attention is
:class:`ContextParallelAttention`: each rank gathers the keys and values of the whole sequence
over the group (the backward sums their gradients back to the rank that holds each token) and
attends its queries to them, causally by the queries' global positions.

megatron-core's own context parallelism is Transformer Engine's attention (CUDA); its local
attention refuses a context-parallel size above 1. This module is the local layer spec's
attention at CP > 1, plain torch (``scaled_dot_product_attention``), on every accelerator.

What the rest of a step needs: the rank's part of the model's inputs (:func:`to_context_rank`:
the decoder input, the rotary position ids), labels shifted over the whole sequence before
they are cut (:func:`context_targets`), and sums over the group (the loss: each rank has only
its tokens'; the gradients of the replicated weights: megatron's data-parallel group *with*
context parallelism, :func:`mmcore.backends.megatron.train.reduce_gradients`). The weights are
the same on every rank of the group, so checkpoints carry nothing of it: a run resumes at any
context-parallel size.
"""

from __future__ import annotations

import functools
from typing import Any


def context_size() -> int:
    """The context-parallel group's size (1 before Megatron's groups exist)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_context_parallel_world_size()


def context_multiple(multiple: int = 1) -> int:
    """The length a sequence is padded to a multiple of: ``multiple`` (the tensor-parallel size
    under sequence parallelism, else 1) times 2 x CP chunks when context-parallel."""
    size = context_size()
    return multiple * 2 * size if size > 1 else multiple


def chunk_positions(length: int, size: int, rank: int, device: Any = None) -> Any:
    """The global positions rank ``rank`` of ``size`` holds of a sequence of ``length`` tokens
    (a multiple of 2 x ``size``): chunk ``rank``, then chunk ``2 x size - 1 - rank``."""
    import torch

    if length % (2 * size):
        raise ValueError(f"a sequence of {length} tokens does not split into 2 x {size} equal chunks")
    chunk = length // (2 * size)
    return torch.cat([torch.arange(i * chunk, (i + 1) * chunk, device=device) for i in (rank, 2 * size - 1 - rank)])


def to_context_rank(tensor: Any, dim: int = 1) -> Any:
    """This rank's part of ``tensor`` along its sequence dimension ``dim`` (the whole, padded,
    sequence): unchanged without context parallelism. Differentiable: the gradient of the other
    ranks' positions is zero here (their ranks add theirs when gradients are summed)."""
    size = context_size()
    if size == 1:
        return tensor
    from megatron.core import parallel_state

    rank = parallel_state.get_context_parallel_rank()
    return tensor.index_select(dim, chunk_positions(tensor.shape[dim], size, rank, tensor.device))


def context_targets(labels: Any, local_length: int, ignore: int) -> Any:
    """The next-token targets [B, local_length] of this rank's positions: ``labels`` [B, S] (the
    whole sequence, unpadded) shifted by one over the whole sequence, padded with ``ignore`` to
    local_length x CP, then cut as the tokens are (so a chunk's last position predicts the
    first token of the next chunk, which another rank holds)."""
    import torch.nn.functional as F

    whole = local_length * context_size()
    shifted = labels[:, 1:]
    shifted = F.pad(shifted, [0, whole - shifted.shape[1]], value=ignore) if whole > shifted.shape[1] else shifted[:, :whole]
    return to_context_rank(shifted, 1)


def _gather_sequence(tensor: Any, group: Any) -> Any:
    import torch

    return _gather_function().apply(tensor, group) if torch.is_grad_enabled() and tensor.requires_grad else _gather(tensor, group)


def _gather(tensor: Any, group: Any) -> Any:
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def _sum_own_part(grad: Any, group: Any) -> Any:
    """Every rank's gradient of the gathered tensor, summed, cut to this rank's part (a
    reduce-scatter: an all-reduce and a slice where the process group has no reduce-scatter)."""
    import torch
    import torch.distributed as dist

    size, rank = dist.get_world_size(group), dist.get_rank(group)
    part = grad.shape[0] // size
    if dist.get_backend(group) != "gloo":
        out = torch.empty((part, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=group)
        return out
    summed = grad.contiguous().clone()
    dist.all_reduce(summed, group=group)
    return summed[rank * part : (rank + 1) * part]


@functools.cache
def _gather_function() -> Any:
    """The autograd function, made at first use (importing this module does not import torch)."""
    import torch

    class GatherSequence(torch.autograd.Function):
        """All-gather along dim 0 over a group; backward: the summed gradient of this rank's part."""

        @staticmethod
        def forward(ctx: Any, tensor: Any, group: Any) -> Any:  # type: ignore[override]
            ctx.group = group
            return _gather(tensor, group)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
            return _sum_own_part(grad, ctx.group), None

    return GatherSequence


def context_attention(query: Any, key: Any, value: Any, group: Any, scale: float) -> Any:
    """Causal attention of this rank's queries ``[s, b, heads, d]`` (its two chunks) to the keys
    and values of the whole sequence, gathered over ``group`` from every rank's ``[s, b, groups,
    d]``; returns ``[s, b, heads x d]``. Grouped-query: each key-value head serves heads / groups
    query heads. Float64 works (the parity test's)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    size, rank = dist.get_world_size(group), dist.get_rank(group)
    local = query.shape[0]
    whole = local * size
    keys, values = _gather_sequence(key, group), _gather_sequence(value, group)
    repeat = query.shape[2] // keys.shape[2]
    if repeat > 1:
        keys, values = keys.repeat_interleave(repeat, dim=2), values.repeat_interleave(repeat, dim=2)
    # the gathered keys are in rank order, each rank's two chunks: their global positions
    key_positions = torch.cat([chunk_positions(whole, size, r, query.device) for r in range(size)])
    query_positions = chunk_positions(whole, size, rank, query.device)
    allowed = key_positions[None, :] <= query_positions[:, None]  # [s, whole]: True attends
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, keys, values))  # [b, heads, seq, d]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    return out.permute(2, 0, 1, 3).reshape(local, query.shape[1], -1)


@functools.cache
def attention_class() -> Any:
    """``ContextParallelAttention``, a megatron-core module (made at first use)."""
    import math

    from megatron.core import parallel_state
    from megatron.core.transformer.module import MegatronModule

    from mmcore.errors import StageError

    class ContextParallelAttention(MegatronModule):
        """The local layer spec's core attention at context-parallel size > 1 (megatron-core's
        ``DotProductAttention`` protocol: ``[s, b, heads, d]`` queries, ``[s, b, groups, d]``
        keys and values of this tensor-parallel rank's heads, causal; no dropout, no mask
        tensor, no packed sequences)."""

        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str,
            attention_dropout: Any = None,
            softmax_scale: Any = None,
            cp_comm_type: Any = None,
            pg_collection: Any = None,
        ) -> None:
            super().__init__(config=config)
            if (config.attention_dropout if attention_dropout is None else attention_dropout) > 0:
                raise StageError("parallel.context_parallel: attention dropout is not supported")
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
            if config.apply_query_key_layer_scaling:
                raise StageError("parallel.context_parallel: apply_query_key_layer_scaling is not supported")
            self.group = pg_collection.cp if pg_collection is not None and hasattr(pg_collection, "cp") else parallel_state.get_context_parallel_group()

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
            if attention_mask is not None or attention_bias is not None or packed_seq_params is not None:
                raise StageError("parallel.context_parallel: attention masks, biases and packed sequences are not supported (causal attention only)")
            return context_attention(query, key, value, self.group, self.softmax_scale)

    return ContextParallelAttention


__all__ = ["context_size", "context_multiple", "chunk_positions", "to_context_rank", "context_targets", "context_attention", "attention_class"]
