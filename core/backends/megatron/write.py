"""A megatron run's weights out at the end of training: the trained weights in the family's
training names (:func:`write_trained`, each rank its pieces, or gathered on rank 0 where the
adapter combines tensors) and, with ``training.lora``, the adapters in PEFT's format
(:func:`write_adapter`)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mmcore.checkpoint.training import INCOMPLETE
from mmcore.backends.megatron.family import Layout, MegatronFamily


def gather_hub_state(model: Sequence[Any], family: MegatronFamily, layout: Layout) -> dict[str, Any] | None:
    """The whole model as hub-named tensors on global rank 0 (None elsewhere): every rank of
    data-parallel replica 0 sends its chunks' shards there, where the table merges them (LoRA
    adapters merged into their base weights first). Holds the whole model in rank 0's memory
    (as an export does)."""
    from mmcore.backends.megatron.lora import merged_state

    def part(chunk: int) -> tuple[dict[str, Any], dict[str, Any]]:
        decoder = {family.decoder_prefix + k: v.cpu() for k, v in merged_state(getattr(model[chunk], family.decoder)).items()}
        whole = {}
        if layout.of_chunk(chunk).virtual_stage == 0 and layout.tp_rank == 0:
            whole = {prefix + k: v.detach().cpu() for prefix, attribute in family.whole.items() for k, v in getattr(model[chunk], attribute).state_dict().items()}
        return decoder, whole

    stages = _gather_by_stage(layout, part)
    if stages is None:
        return None
    pmap = family.parallel_map
    merged = [pmap.merge_tp([decoder for decoder, _ in ranks]) for ranks in stages]
    hub = pmap.to_hf(pmap.merge_pp(merged) if len(merged) > 1 else merged[0])
    for ranks in stages:
        for _, whole in ranks:
            hub.update(whole)
    return hub


def _gather_by_stage(layout: Layout, part: Callable[[int], Any]) -> list[list[Any]] | None:
    """``part(chunk)`` of every chunk of every rank of data-parallel replica 0, on global rank 0:
    one list per (virtual) pipeline stage in the model's order, in tensor-parallel rank order
    (None on the other ranks)."""
    import torch.distributed as dist

    mine = (layout.stage, layout.tp_rank, [part(v) for v in range(layout.virtual)]) if layout.first_replica else None
    parts: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(mine, parts if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return None
    received = sorted((p for p in parts if p is not None), key=lambda p: (p[0], p[1]))
    return [[chunks[v] for stage, _, chunks in received if stage == s] for v in range(layout.virtual) for s in range(layout.pp)]


def write_trained(folder: Path, model: Sequence[Any], family: MegatronFamily, layout: Layout, world: Any, index: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The trained weights in the family's training names as a DCP model checkpoint
    (``model.<name>``: what export and :func:`mmcore.checkpoint.training.load_converted` read),
    replacing ``folder`` only once complete. With ``index`` (convert's tensors: training name
    -> shape, the whole shapes) and an adapter that only renames, every rank writes its own
    pieces (:mod:`mmcore.backends.megatron.trained`: no rank holds more than its part) and None is
    returned. Otherwise (an adapter that combines tensors; callers of SDK < 1.15) the model is
    gathered on rank 0, which must hold it whole, and gets it back under hub names."""
    import os

    import torch.distributed as dist

    from mmcore.framework.files import fsync_dir
    from mmcore.backends.megatron.trained import rank_pieces, renames_only, write_pieces

    to_hub = family.adapter.to_hf(dict(index)) if index is not None else None
    partial = folder.with_name(folder.name + INCOMPLETE)
    if world.is_local_main:  # as commit_checkpoint: each node's local rank 0, each step tolerating another node's having done it
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
    if world.distributed:
        dist.barrier()
    hub = None
    if index is not None and to_hub is not None and renames_only(to_hub):
        write_pieces(partial, rank_pieces(model, family, layout, to_hub), {name: info.shape for name, info in index.items()})
    else:
        hub = _write_gathered(partial, model, family, layout)
    if world.distributed:
        dist.barrier()
    if world.is_local_main:
        with contextlib.suppress(FileNotFoundError):  # another node on the same file system moved it already
            os.replace(partial, folder)
        fsync_dir(folder.parent)
    if world.distributed:
        dist.barrier()
    return hub


def _write_gathered(partial: Path, model: Sequence[Any], family: MegatronFamily, layout: Layout) -> dict[str, Any] | None:
    """The trained weights through rank 0, for an adapter that combines tensors (a piece of a
    hub tensor is then no piece of a training tensor): :func:`gather_hub_state`, converted;
    the hub tensors on rank 0 (None elsewhere)."""
    import torch.distributed.checkpoint as dcp

    from mmcore.engines.state_dict import TensorInfo, materialize

    hub = gather_hub_state(model, family, layout)
    if hub is not None:
        plan = family.adapter.to_mm({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in hub.items()})
        state = {name: materialize(recipe, hub.__getitem__).contiguous() for name, recipe in plan.items()}
        dcp.save({"model": state}, checkpoint_id=str(partial), no_dist=True)
    return hub


def write_adapter(
    folder: Path,
    model: Sequence[Any],
    family: MegatronFamily,
    layout: Layout,
    world: Any,
    lora: Any,
    base_model: Path,
    hub: Mapping[str, Any] | None = None,
    saved: Sequence[str] = (),
    trained: Path | None = None,
) -> None:
    """The LoRA adapters in PEFT's format (``PeftModel.from_pretrained`` on the base model loads
    them): every tensor-parallel rank's shards of every stage, merged by the table on rank 0;
    with ``saved`` (the hub names of ``modules_to_save``'s tensors), their trained tensors
    whole, from ``hub`` (what a gathering :func:`write_trained` returned) or read from
    ``trained`` (its checkpoint), a tied output layer's beside the embedding's."""
    import torch.distributed as dist

    from mmcore.backends.megatron.lora import adapter_shards, peft_state, write_peft

    def part(chunk: int) -> dict[str, Any]:
        shards = adapter_shards(getattr(model[chunk], family.decoder), prefix=family.decoder_prefix)
        return {name: (a.cpu(), b.cpu()) for name, (a, b) in shards.items()}

    stages = _gather_by_stage(layout, part)
    if stages is not None:
        tensors: dict[str, Any] = {}
        for ranks in stages:
            tensors.update(peft_state(family.parallel_map, ranks, family.adapter.model_name))
        modules = []
        if saved and hub is None and trained is not None:
            hub = _read_hub(trained, family, saved)
        if saved and hub is not None:
            names = [name for name in saved if name in hub]
            pmap = family.parallel_map
            if pmap.tied and any(name in names for name in pmap.rule_of(pmap.tied[1]).hf):  # peft saves a tied partner too
                names += [name for name in pmap.rule_of(pmap.tied[0]).hf if name not in hub and name not in names]
                hub = {**hub, **{name: hub[pmap.rule_of(pmap.tied[1]).hf[0]] for name in pmap.rule_of(pmap.tied[0]).hf if name not in hub}}
            for name in names:
                module = family.adapter.model_name(name)
                tensors[f"base_model.model.{module}"] = hub[name].clone()
                modules.append(module.rsplit(".", 1)[0])
        shutil.rmtree(folder, ignore_errors=True)
        write_peft(folder, tensors, lora.r, lora.alpha, base_model, lora.dropout, sorted(set(modules)))
    if world.distributed:
        dist.barrier()


def _read_hub(trained: Path, family: MegatronFamily, names: Sequence[str]) -> dict[str, Any]:
    """The hub tensors ``names`` (those the checkpoint has) read whole from a trained checkpoint."""
    from mmcore.engines.state_dict import materialize
    from mmcore.engines.convert import dcp_index, load_dcp_tensors

    index = dcp_index(trained)
    plan = {name: recipe for name, recipe in family.adapter.to_hf(index).items() if name in set(names)}
    tensors = load_dcp_tensors(trained, {source for recipe in plan.values() for source in recipe.sources}, index)
    return {name: materialize(recipe, tensors.__getitem__) for name, recipe in plan.items()}


__all__ = ["gather_hub_state", "write_trained", "write_adapter"]
