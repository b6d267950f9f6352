"""The trained weights, written by every rank at once: each rank of data-parallel replica 0 writes
the pieces of the hub tensors its shards make (:meth:`mmcore.backends.megatron.tensor_map.Rule.pieces`), under
the family's training names, into one DCP checkpoint (torch's distributed save: the coordinator
writes the metadata, which checks that the pieces tile every tensor once). No rank gathers the
model or holds more than its own part plus the piece being written, so the end of a run needs
no host that can hold the whole model, whatever its size.

The checkpoint reads as the FSDP2 loop's (``model.<training name>``): export, evaluation and a
resume on FSDP2 read it through DCP, which assembles each tensor from its pieces.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.errors import StageError
from mmcore.framework.faults import crash_point

if TYPE_CHECKING:
    import torch

    from mmcore.engines.state_dict import Recipe
    from mmcore.backends.megatron.engine import Layout, MegatronFamily


@dataclass(frozen=True)
class Piece:
    """A block of one whole tensor that this rank writes: where it starts, its shape and dtype,
    and how to make it (when the writer asks for it, so a rank holds one piece at a time)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: "torch.dtype"
    make: Callable[[], "torch.Tensor"]


def renames_only(to_hub: Mapping[str, "Recipe"]) -> bool:
    """Whether each hub tensor is one training tensor under another name (the adapter only
    renames): then a rank's piece of a hub tensor is a piece of a training tensor."""
    return all(recipe.combine is None and len(recipe.sources) == 1 for recipe in to_hub.values())


def rank_pieces(model: Sequence[Any], family: "MegatronFamily", layout: "Layout", to_hub: Mapping[str, "Recipe"]) -> dict[str, list[Piece]]:
    """Training name -> this rank's pieces of it: its chunks' decoder shards (LoRA adapters merged
    into their base weights as each piece is made), cut back into the hub tensors by the table, and the ``whole``
    modules from tensor-parallel rank 0 of the first stage. Replicas of data-parallel rank > 0
    write nothing; a tensor the table replicates over TP is written by TP rank 0, after the
    ranks have checked that they hold the same values."""
    from mmcore.backends.megatron.engine import rank_sources
    from mmcore.backends.megatron.lora import merged_makers

    if not layout.first_replica:
        return {}
    pmap, prefix = family.parallel_map, family.decoder_prefix
    out: dict[str, list[Piece]] = {}

    def add(hub_name: str, offsets: tuple[int, ...], tensor: "torch.Tensor", make: Callable[[], "torch.Tensor"]) -> None:
        out.setdefault(to_hub[hub_name].sources[0], []).append(Piece(offsets, tuple(tensor.shape), tensor.dtype, make))

    replicated: dict[str, "torch.Tensor"] = {}
    for v, chunk in enumerate(model):
        place = layout.of_chunk(v)
        state = merged_makers(getattr(chunk, family.decoder))  # a LoRA weight merged when its piece is written
        mine, whole = rank_sources(family, list(to_hub), place)
        for name, (rule, parts) in mine.items():
            if pmap.tied and name == pmap.tied[0]:
                continue  # the hub ties the output layer to the embedding: no tensor of its own
            template, make = state[name[len(prefix) :]]
            if rule.kind == "replicated":
                replicated[name] = make()
            shape = rule.pieces(template.to("meta"), layout.tp, layout.tp_rank, pmap.vocab_size)
            for k, (which, offsets, piece) in enumerate(shape):
                add(parts[which], offsets, piece, lambda rule=rule, make=make, k=k: rule.pieces(make(), layout.tp, layout.tp_rank, pmap.vocab_size)[k][2])
        if layout.tp_rank == 0 and whole:  # on the first stage
            for module_prefix, attribute in family.whole.items():
                for key, tensor in getattr(chunk, attribute).state_dict().items():
                    if module_prefix + key in whole:
                        add(module_prefix + key, (0,) * tensor.dim(), tensor, lambda tensor=tensor: tensor)
    _check_replicas(replicated, layout)
    return out


def _check_replicas(replicated: Mapping[str, "torch.Tensor"], layout: "Layout") -> None:
    """The tensors the table replicates over TP hold the same values on every TP rank (one
    element-wise max and min over the TP group; one rank writes them for all)."""
    if layout.tp == 1 or not replicated:
        return
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    names = sorted(replicated)
    flat = torch.cat([replicated[name].detach().float().reshape(-1) for name in names])
    high, low = flat.clone(), flat.clone()
    group = parallel_state.get_tensor_model_parallel_group()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    if not torch.equal(high, low):
        at = int((high != low).nonzero()[0])
        for name in names:
            at -= replicated[name].numel()
            if at < 0:
                raise StageError(f"{name}: a replicated tensor differs between tensor-parallel ranks")


def write_pieces(folder: Path, pieces: Mapping[str, Sequence[Piece]], sizes: Mapping[str, tuple[int, ...]], prefix: str = "model.") -> None:
    """One DCP checkpoint at ``folder`` of the whole tensors ``sizes`` (name -> shape) that the
    ranks' ``pieces`` make up, every rank of the default process group calling it (a rank may
    have none). Each piece goes into a file of its own (a tensor one rank wrote whole is read by
    mapping its file, as convert's are)."""
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.utils.serialization
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    from mmcore.engines.convert import WRITER_THREADS

    makers = {(prefix + name, piece.offsets): piece.make for name, own in pieces.items() for piece in own}
    made = itertools.count(1)  # the crash point's count (the writer's threads share it; next() is atomic)

    class PiecesPlanner(DefaultSavePlanner):
        """Plans this rank's pieces as shards of their whole tensors; makes each when it is written."""

        def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
            self.state_dict, self.is_coordinator = {}, is_coordinator

        def create_local_plan(self) -> SavePlan:
            items = [
                WriteItem(
                    index=MetadataIndex(prefix + name, torch.Size(piece.offsets)),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=torch.Size(piece.offsets), sizes=torch.Size(piece.sizes)), properties=TensorProperties(dtype=piece.dtype), size=torch.Size(sizes[name])
                    ),
                )
                for name, own in pieces.items()
                for piece in own
            ]
            self.plan = SavePlan(items)
            return self.plan

        def resolve_data(self, write_item: WriteItem) -> "torch.Tensor":
            crash_point("trained-piece", next(made))
            tensor = makers[(write_item.index.fqn, tuple(write_item.index.offset))]().detach().cpu()
            # torch.save writes a view's whole storage: a piece cut from a larger tensor is copied out
            if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
                tensor = tensor.clone(memory_format=torch.contiguous_format)
            return tensor

    writer = FileSystemWriter(str(folder), single_file_per_rank=False, thread_count=WRITER_THREADS)
    with torch.utils.serialization.config.patch({"save.compute_crc32": False}):
        dcp.save({}, storage_writer=writer, planner=PiecesPlanner(flatten_state_dict=False, flatten_sharded_tensors=False))


__all__ = ["Piece", "renames_only", "rank_pieces", "write_pieces"]
