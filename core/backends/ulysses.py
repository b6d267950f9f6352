"""Ulysses sequence parallelism (``parallel.ulysses: N``) for a transformers text decoder on the
FSDP2 backend: the N ranks of a sequence group hold the same packed row, each runs the decoder
on 1/N of its tokens, and around attention an all-to-all trades the sequence split for a head
split, so each rank attends over the whole row with H/N heads (DeepSpeed-Ulysses, as VeOmni and
ms-swift apply it).

Why this shape:

* **Split at the decoder's input.** The towers and the embedding run on the whole row on every
  rank of the group (their cost is the media's, not the sequence's); a forward pre-hook on the
  text decoder (``model.get_decoder()``) keeps this rank's slice of ``inputs_embeds`` and of
  every position tensor (1-D, or M-RoPE's rows), and of the DeepStack features Qwen3-VL adds at
  its visual tokens, so RoPE, norms, MLPs and the LM head run on T/N tokens and the logits come
  out sharded.
* **Attention sees the whole row.** After the all-to-all each rank holds every token for its
  heads; the packed row's segment bounds come from the whole row's positions (gathered), so
  samples that cross a rank's boundary attend exactly as unsplit (the inner attention is the
  packed ``varlen_attention`` path of :mod:`mmcore.train.attention`).
* **No special loss reduction.** Each rank's loss is the sum over its slice of next-token
  targets (shifted on the whole row before slicing) and its ``num_loss_tokens`` counts that
  slice only, so the train loop's global token count and FSDP's gradient average over all ranks
  give the unsplit step's gradient: the slices' sums add up to the row's.
* **Only where sharded.** The hook and the attention act inside :func:`sharded` (the recipe's
  loss); evaluation and generation run the whole row as before.

Rows are padded to a multiple of N by one more packed segment of pad tokens (no labels), which
attends only to itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

IMPLEMENTATION = "mmcore_ulysses"
IGNORE = -100


@dataclass(frozen=True)
class SequenceGroup:
    """This rank's sequence group: ``size`` ranks (consecutive global ranks) sharing one row;
    ``rank`` is this rank's place in it, ``group`` the process group (None on one rank)."""

    size: int
    rank: int
    group: Any = None

    @classmethod
    def create(cls, world_rank: int, world_size: int, size: int) -> "SequenceGroup":
        """Every rank calls this (``new_group`` is collective): groups of ``size`` consecutive ranks."""
        import torch.distributed as dist

        if size == 1:
            return cls(1, 0)
        mine = None
        for first in range(0, world_size, size):
            group = dist.new_group(list(range(first, first + size)))
            if first <= world_rank < first + size:
                mine = group
        return cls(size, world_rank % size, mine)


_ACTIVE: contextvars.ContextVar[SequenceGroup | None] = contextvars.ContextVar("mmcore_ulysses", default=None)


@contextlib.contextmanager
def sharded(group: SequenceGroup) -> Iterator[None]:
    """Within: the decoder runs on this rank's slice of the row (:func:`use_ulysses`)."""
    token = _ACTIVE.set(group)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


# --------------------------------------------------------------------------- the batch


def pad_sample(total: int, size: int, pad_id: int) -> dict[str, Any] | None:
    """A pad sample that brings a row of ``total`` tokens to a multiple of ``size`` (None: it is one)."""
    import torch

    missing = -total % size
    if not missing:
        return None
    return {"input_ids": torch.full((missing,), pad_id, dtype=torch.long), "labels": torch.full((missing,), IGNORE, dtype=torch.long)}


def shard_labels(batch: dict[str, Any], rank: int, size: int) -> dict[str, Any]:
    """``batch`` (one packed row of a multiple of ``size`` tokens) with the next-token targets
    of slice ``rank`` (``shard_labels``, shifted on the whole row) and their count."""
    import torch

    labels = batch["labels"]
    if labels.shape[0] != 1 or labels.shape[1] % size:
        raise ValueError(f"parallel.ulysses splits one packed row of a multiple of {size} tokens; got rows of shape {tuple(labels.shape)}")
    targets = torch.cat([labels[:, 1:], labels.new_full((1, 1), IGNORE)], dim=1)
    width = labels.shape[1] // size
    mine = targets[:, rank * width : (rank + 1) * width]
    return {**batch, "shard_labels": mine, "num_loss_tokens": int((mine != IGNORE).sum())}


def shard_loss_sum(logits: Any, batch: dict[str, Any]) -> Any:
    """Summed cross-entropy of this rank's logits ([1, T/N, V]) on its ``shard_labels``."""
    import torch.nn.functional as F

    targets = batch["shard_labels"]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="sum")


# --------------------------------------------------------------------------- the all-to-all


def _all_to_all(x: Any, group: SequenceGroup) -> Any:
    """Chunk ``i`` of ``x``'s first dimension goes to rank ``i``; what arrives from rank ``j``
    is chunk ``j`` of the result (differentiable: the backward is the reverse all-to-all)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    # contiguous: the collective reads the chunks in memory order (a permuted view would scramble them)
    return wait_tensor(all_to_all_single_autograd(x.contiguous(), None, None, group.group))


def exchange(x: Any, group: SequenceGroup, split: int, join: int) -> Any:
    """Chunk ``i`` of ``x`` along ``split`` goes to rank ``i``; what the group's ranks send this
    one is joined along ``join``, in rank order."""
    import torch

    sent = torch.stack(x.chunk(group.size, dim=split))  # [rank it goes to, ...]
    return torch.cat(_all_to_all(sent, group).unbind(0), dim=join)


def sequence_to_heads(x: Any, group: SequenceGroup) -> Any:
    """[B, H, T/N, D] (this rank's tokens, every head) -> [B, H/N, T, D] (every token, its heads)."""
    return exchange(x, group, split=1, join=2)


def heads_to_sequence(x: Any, group: SequenceGroup) -> Any:
    """[B, T, H/N, D] (every token, this rank's heads) -> [B, T/N, H, D] (its tokens, every head)."""
    return exchange(x, group, split=1, join=2)


def _gather_sequence(x: Any, group: SequenceGroup) -> Any:
    """This rank's slice of a [.., T/N] tensor (no gradient) -> the whole [.., T]."""
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(group.size)]
    dist.all_gather(parts, x.contiguous(), group=group.group)
    return torch.cat(parts, dim=-1)


# --------------------------------------------------------------------------- transformers' side


def ulysses_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *, inner: Callable[..., Any], **kwargs: Any) -> tuple[Any, None]:
    """transformers' attention-function contract (``query`` [B, H, T, D] -> [B, T, H, D]);
    outside :func:`sharded` it is ``inner`` unchanged."""
    group = _ACTIVE.get()
    if group is None or group.size == 1:
        return inner(module, query, key, value, attention_mask, **kwargs)
    heads, n = query.shape[1], group.size
    if heads % n:
        raise ValueError(f"parallel.ulysses={n} splits attention heads over ranks: the decoder's {heads} heads do not divide")
    if key.shape[1] % n:  # fewer key/value heads than ranks: each rank takes the copies its query heads read
        key, value = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (key, value))
    q, k, v = (sequence_to_heads(t, group) for t in (query, key, value))
    positions = kwargs.pop("position_ids", None)
    if positions is not None:
        positions = _gather_sequence(positions, group)
    out, _ = inner(module, q, k, v, attention_mask, position_ids=positions, **kwargs)
    return heads_to_sequence(out, group), None


def _slice_decoder_inputs(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The decoder's forward pre-hook: inside :func:`sharded`, this rank's slice of the row."""
    group = _ACTIVE.get()
    if group is None or group.size == 1:
        return args, kwargs
    embeds = kwargs.get("inputs_embeds")
    if embeds is None or args or kwargs.get("position_ids") is None:
        raise ValueError("parallel.ulysses: the text decoder must be called with inputs_embeds and position_ids as keywords (a packed row)")
    if kwargs.get("attention_mask") is not None:
        raise ValueError("parallel.ulysses splits packed rows (training.packing: true), which have no attention mask")
    width = embeds.shape[1] // group.size
    start, end = group.rank * width, (group.rank + 1) * width
    kwargs = {**kwargs, "inputs_embeds": embeds[:, start:end], "position_ids": kwargs["position_ids"][..., start:end]}
    masks = kwargs.get("visual_pos_masks")
    if masks is not None:  # Qwen3-VL's DeepStack: the tower features added at the visual tokens of early layers
        before, inside = int(masks[:, :start].sum()), int(masks[:, start:end].sum())
        kwargs["visual_pos_masks"] = masks[:, start:end]
        if kwargs.get("deepstack_visual_embeds") is not None:
            kwargs["deepstack_visual_embeds"] = [rows[before : before + inside] for rows in kwargs["deepstack_visual_embeds"]]
    return args, kwargs


def use_ulysses(model: Any, inner: Callable[..., Any], name: str = IMPLEMENTATION) -> str:
    """Split ``model``'s text decoder over the sequence group inside :func:`sharded`, attention
    through ``inner`` (an attention function, e.g. the packed one) on the whole row."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from mmcore.train.attention import _mask

    AttentionInterface.register(name, functools.partial(ulysses_attention_forward, inner=inner))
    AttentionMaskInterface.register(name, _mask)
    model.config.get_text_config()._attn_implementation = name
    model.get_decoder().register_forward_pre_hook(_slice_decoder_inputs, with_kwargs=True)
    return name


# --------------------------------------------------------------------------- diffusers' side


def use_ulysses_denoiser(model: Any, world_rank: int, world_size: int, size: int, device: Any) -> None:
    """Split a diffusers denoiser's tokens over sequence groups of ``size`` ranks with diffusers'
    own context parallelism (the model class's ``_cp_plan``: its patch tokens and rotary tables
    split after the embedding, the output gathered before unpatchifying; Ulysses all-to-alls in
    the attention dispatch, whose SDPA backend has a backward). Every rank of a group then
    computes the whole prediction, each from its tokens: see :func:`split_sum`.

    diffusers resolves its device with ``torch.accelerator`` (none on a CPU), so the config is set
    up here with the engine's device and a (data, ring, ulysses) mesh whose last two dimensions
    are this rank's group."""
    from torch.distributed.device_mesh import init_device_mesh

    if getattr(model, "_cp_plan", None) is None:
        raise ValueError(f"parallel.ulysses: {type(model).__name__} has no context-parallel plan in diffusers (its _cp_plan)")
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    mesh = init_device_mesh(device.type, (world_size // size, 1, size), mesh_dim_names=("data", "ring", "ulysses"))["ring", "ulysses"]
    config = ContextParallelConfig(ulysses_degree=size, mesh=mesh)

    def resolve(requested: Any) -> Any:
        resolved = ParallelConfig(context_parallel_config=requested)
        resolved.setup(world_rank, world_size, device, mesh=mesh)
        model._parallel_config = resolved
        return resolved

    model.set_attention_backend("native")
    model._resolve_parallel_config = resolve  # this instance only
    try:
        model.enable_parallelism(config=config)
    finally:
        del model._resolve_parallel_config


def split_sum(loss: Any, size: int) -> Any:
    """A sequence group's share of a loss every rank of it computes whole: the value ``loss /
    size`` (the group's values add up to the loss) with ``loss``'s own gradient, which on each
    rank reaches the weights through its tokens only (diffusers' gather hands each rank its
    part of the gradient): the group's gradients add up to the loss's."""
    return loss - loss.detach() * (1 - 1 / size)


__all__ = [
    "SequenceGroup",
    "sharded",
    "pad_sample",
    "shard_labels",
    "shard_loss_sum",
    "sequence_to_heads",
    "heads_to_sequence",
    "ulysses_attention_forward",
    "use_ulysses",
    "use_ulysses_denoiser",
    "split_sum",
]
