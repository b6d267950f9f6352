"""A megatron rank's weights in: which converted tensors make up this rank's part
(:func:`rank_sources`), loading them one layer at a time (:func:`load_rank`, :func:`fill_rank`),
and picking parameters by training name for ``training.freeze`` and ``training.lora``
(:func:`freeze_rank`, :func:`chosen_parameters`, :func:`saved_modules`, :func:`lora_kinds`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from mmcore.errors import StageError
from mmcore.backends.megatron.family import Layout, MegatronFamily


def _stage_layers(family: MegatronFamily, megatron_names: Mapping[str, Any], pp: int) -> dict[str, list[int]]:
    """Layers per stage of each of the table's stacks: the decoder's as even as they go (as
    ``build`` places them, :func:`mmcore.backends.megatron.tensor_map.even_layers`), none of any other."""
    from mmcore.backends.megatron.tensor_map import even_layers

    pmap = family.parallel_map
    return {stack.prefix: even_layers(pmap.layer_count(megatron_names, stack), pp) if stack.prefix.startswith(family.decoder_prefix) else [0] * pp for stack in pmap.stacks}


def rank_sources(family: MegatronFamily, hub_names: Sequence[str], layout: Layout) -> tuple[dict[str, tuple[Any, tuple[str, ...]]], list[str]]:
    """From the names alone: this rank's decoder tensors (its stage's local Megatron names ->
    (the table's rule, the hub tensors fused into it)) and the hub tensors of the ``whole``
    modules it holds (on the first stage), so a rank reads only its stage's part. With
    virtual stages, the part of the chunk ``layout.chunk``."""
    pmap = family.parallel_map
    plan = {name: made for name, made in pmap.plan(hub_names).items() if name.startswith(family.decoder_prefix)}
    local = {name: name for name in plan}  # split_pp only moves values: here, each tensor's global name
    stages = layout.pp * layout.virtual  # virtual stages: chunk v of stage s is the (v x PP + s)-th
    if stages > 1:
        local = pmap.split_pp(local, _stage_layers(family, local, stages))[layout.virtual_stage]
    whole = [name for name in hub_names if layout.virtual_stage == 0 and name.startswith(tuple(family.whole))]
    return {name: plan[global_name] for name, global_name in local.items()}, whole


def freeze_rank(model: Sequence[Any], family: MegatronFamily, layout: Layout, checkpoint: Path, patterns: Sequence[str], groups: Mapping[str, Sequence[str]]) -> int:
    """``training.freeze`` on this rank's model chunks: the patterns (globs, the recipe's groups)
    pick training names of convert's checkpoint, as on FSDP2; a Megatron parameter is frozen
    when every tensor it is made of is (through the family's adapter and table), and one made
    of frozen and trained tensors (a fused QKV with only q frozen) is a one-line error, as is
    a layer's tensor frozen in some layers only. Returns how many training names are frozen
    (the FSDP2 loop's count)."""
    from mmcore.engines.convert import dcp_index
    from mmcore.train.optim import frozen_names

    index = dcp_index(checkpoint)
    frozen = set(frozen_names(list(index), patterns, groups))
    for _, parameter in chosen_parameters(model, family, layout, index, frozen, "training.freeze", "frozen"):
        parameter.requires_grad_(False)
    return len(frozen)


def chosen_parameters(model: Sequence[Any], family: MegatronFamily, layout: Layout, index: Mapping[str, Any], chosen: set[str], setting: str, does: str) -> list[tuple[str, Any]]:
    """This rank's Megatron parameters (global names) made only of the ``chosen`` training names
    (through the family's adapter and table; the vision tower's by name, a tied output layer's
    copy as the embedding). One made of chosen and other tensors (a fused QKV with only q
    chosen), or a layer's tensor chosen in some layers only, is a one-line error naming
    ``setting`` (what it ``does``)."""
    to_hub = family.adapter.to_hf(index)  # hub name -> the training names it is made of
    pmap = family.parallel_map
    plan = pmap.plan(list(to_hub))  # global Megatron name -> (rule, the hub tensors it is made of)
    _same_in_every_layer(family, {name: {s for part in parts for s in to_hub[part].sources} <= chosen for name, (_, parts) in plan.items() if name.startswith(family.decoder_prefix)}, setting, does)
    # a tied output layer's copy (the last stage's) is made of what the embedding is
    tied = {pmap.tied[0]: plan[pmap.tied[1]][1]} if pmap.tied and pmap.tied[1] in plan else {}
    found = []
    for v, chunk in enumerate(model):
        mine, _ = rank_sources(family, list(to_hub), layout.of_chunk(v))
        made_of: dict[str, tuple[Any, tuple[str, ...]]] = {}
        for name, parameter in getattr(chunk, family.decoder).named_parameters():
            full = family.decoder_prefix + name
            made_of[full] = (parameter, mine[full][1] if full in mine else tied.get(full, ()))
        for prefix, attribute in family.whole.items():
            module = getattr(chunk, attribute, None) if layout.of_chunk(v).virtual_stage == 0 else None
            for name, parameter in module.named_parameters() if module is not None else ():
                made_of[prefix + name] = (parameter, (prefix + name,))
        for name, (parameter, hub) in made_of.items():
            sources = {source for part in hub for source in to_hub[part].sources}
            if sources and sources <= chosen:
                found.append((name, parameter))
            elif sources & chosen:
                raise StageError(
                    f"{setting}: {sorted(sources & chosen)[0]} is {does} but not {sorted(sources - chosen)[0]}; on parallel.backend: megatron they are one tensor ({name}): all of them or none"
                )
    return found


def saved_modules(family: MegatronFamily, index: Mapping[str, Any], lora: Any, groups: Mapping[str, Sequence[str]]) -> set[str]:
    """``training.lora.modules_to_save``: the training names of the modules its globs and the
    recipe's groups pick (a module holding parameters itself, as on FSDP2)."""
    from mmcore.train.lora import expand_groups, matches_any

    saved: set[str] = set()
    for entry, globs in expand_groups(lora.modules_to_save, groups):
        hit = {name for name in index if matches_any(name.rsplit(".", 1)[0], globs)}
        if not hit:
            raise StageError(f"training.lora.modules_to_save: {entry!r} matches no module with parameters")
        saved |= hit
    return saved


def _same_in_every_layer(family: MegatronFamily, chosen: Mapping[str, bool], setting: str = "training.freeze", does: str = "frozen") -> None:
    """megatron-core checkpoints a decoder layer's tensor of one kind in all layers as one
    tensor (layers stacked), with the optimizer's state beside it: a kind frozen (or adapted) in
    some layers and not in others would leave holes in that state. ``chosen``: global Megatron
    name -> whether ``setting`` chose it (``does``: what it does to it, for the message)."""
    import re

    kinds: dict[str, dict[bool, str]] = {}
    for name, is_chosen in chosen.items():
        if re.search(r"\.layers\.\d+\.", name):
            kinds.setdefault(re.sub(r"\.layers\.\d+\.", ".layers.N.", name), {})[is_chosen] = name
    for kind, seen in kinds.items():
        if len(seen) == 2:
            raise StageError(
                f"{setting}: {seen[True]} is {does} but not {seen[False]}: on parallel.backend: megatron a layer's tensor is {does} in "
                f"every layer or in none (megatron-core checkpoints {kind} of all layers as one tensor)"
            )


def lora_kinds(family: MegatronFamily, checkpoint: Path, lora: Any, groups: Mapping[str, Sequence[str]], freeze: Sequence[str]) -> tuple[str, ...]:
    """``training.lora.target_modules`` on megatron: which of a decoder layer's linears
    (:data:`mmcore.backends.megatron.lora.DEFAULT_TARGETS`) get adapters. The globs and the recipe's
    groups pick training modules (a weight's name less ``.weight``) as on FSDP2, less what
    ``training.freeze`` freezes; through the family's adapter and table they must make up whole
    layer linears (q, k and v are one linear; gate and up one), the same in every layer, and
    nothing outside them (the embedding, the output layer, the vision tower). Empty
    ``target_modules``: every layer linear, as FSDP2's default (the language model's blocks)."""
    import re

    from mmcore.engines.convert import dcp_index
    from mmcore.train.lora import expand_groups, matches_any
    from mmcore.backends.megatron.lora import DEFAULT_TARGETS
    from mmcore.train.optim import frozen_names

    if not lora.target_modules:
        return DEFAULT_TARGETS
    index = dcp_index(checkpoint)
    to_hub = family.adapter.to_hf(index)  # hub name -> the training names it is made of
    frozen = set(frozen_names(list(index), freeze, groups)) if freeze else set()
    weights = {name.removesuffix(".weight"): name for name, info in index.items() if name.endswith(".weight") and len(info.shape) >= 2}
    targeted: set[str] = set()
    for entry, globs in expand_groups(lora.target_modules, groups):
        hit = [weights[module] for module in weights if matches_any(module, globs)]
        if not hit:
            raise StageError(f"training.lora.target_modules: {entry!r} matches no linear or embedding layer and is no group (groups: {', '.join(groups) or 'none'})")
        targeted.update(name for name in hit if name not in frozen)
    adapted: dict[str, bool] = {}
    covered: set[str] = set()
    for name, (_, parts) in family.parallel_map.plan(list(to_hub)).items():
        kind = name.rsplit(".", 2)[-2]
        if not (name.startswith(family.decoder_prefix) and name.endswith(".weight") and re.search(r"\.layers\.\d+\.", name) and kind in DEFAULT_TARGETS):
            continue
        sources = {source for part in parts for source in to_hub[part].sources}
        covered |= sources
        if sources & targeted and not sources <= targeted:
            raise StageError(
                f"training.lora.target_modules adapts {sorted(sources & targeted)[0].removesuffix('.weight')} but not {sorted(sources - targeted)[0].removesuffix('.weight')}; "
                f"on parallel.backend: megatron they are one linear ({name.removeprefix(family.decoder_prefix)}): adapt all of them or none"
            )
        adapted[name] = bool(sources) and sources <= targeted
    outside = sorted(targeted - covered)
    if outside:
        raise StageError(
            f"training.lora.target_modules: {outside[0].removesuffix('.weight')} is not a linear of the language model's layers; "
            "LoRA on parallel.backend: megatron adapts only those (parallel.backend: fsdp2 adapts any linear or embedding)"
        )
    _same_in_every_layer(family, adapted, "training.lora.target_modules", "adapted")
    kinds = tuple(kind for kind in DEFAULT_TARGETS if any(adapted[name] for name in adapted if name.rsplit(".", 2)[-2] == kind))
    if not kinds:
        raise StageError("training.lora: no layer to adapt (every target is frozen by training.freeze)")
    return kinds


def load_rank(model: Any, family: MegatronFamily, checkpoint: Path, layout: Layout) -> None:
    """Fill this rank's ``model`` from convert's checkpoint (training names, DCP) by
    :func:`fill_rank`: only the tensors this stage is made of are read, one layer at a time."""
    from mmcore.engines.state_dict import materialize
    from mmcore.engines.convert import dcp_index, load_dcp_tensors, read_whole_tensor, whole_tensor_files

    index = dcp_index(checkpoint)
    to_hub = family.adapter.to_hf(index)  # hub name -> how to make it from training names
    mapped = whole_tensor_files(checkpoint)  # as convert writes them: each tensor alone in a file

    def read(hub_names: set[str]) -> dict[str, Any]:
        # a mapped tensor's pages are read as the rank's slice is copied out (Rule.shard): a
        # rank reads about its part; DCP's reader would decode each tensor whole beside its bytes
        sources = {source for name in hub_names for source in to_hub[name].sources}
        tensors = {name: read_whole_tensor(mapped[name], index[name]) for name in sources if name in mapped}
        if sources - set(tensors):
            tensors.update(load_dcp_tensors(checkpoint, sources - set(tensors), index))
        return {name: materialize(to_hub[name], tensors.__getitem__) for name in hub_names}

    fill_rank(model, family, layout, list(to_hub), read)


def fill_rank(model: Any, family: MegatronFamily, layout: Layout, hub_names: Sequence[str], read: Callable[[set[str]], Mapping[str, Any]]) -> None:
    """Fill this rank's ``model`` from hub-named tensors (``read(names) -> {name: tensor}``, any
    storage): the decoder's tensor-parallel shard of this stage, cut by the table, and the
    ``whole`` modules on the first stage. One layer is read at a time: a rank holds its shard
    plus one layer's whole tensors (host memory ~ model / (TP x PP) + a layer)."""
    from mmcore.backends.megatron.gpt import check_rank_names, copy_rank_state

    mine, whole = rank_sources(family, hub_names, layout)
    decoder = getattr(model, family.decoder)
    check_rank_names(decoder, list(mine), family.decoder_prefix)
    for group in _by_layer(mine):
        hub = read({part for name in group for part in mine[name][1]})
        copy_rank_state(decoder, {name: rule.shard([hub[part] for part in parts], layout.tp, layout.tp_rank) for name, (rule, parts) in ((name, mine[name]) for name in group)}, family.decoder_prefix)
    if layout.virtual_stage == 0 and whole:
        for prefix, attribute in family.whole.items():
            module, names = getattr(model, attribute), [name for name in whole if name.startswith(prefix)]
            check_rank_names(module, names, prefix)
            for group in _by_layer(names):  # a block at a time, as the decoder's layers
                copy_rank_state(module, read(set(group)), prefix)


def _by_layer(names: Iterable[str]) -> list[list[str]]:
    """Names grouped by the numbered layer or block they belong to (``...layers.N.``,
    ``...blocks.N.``: up to the first number in the name); every other tensor (embedding,
    final norm, output layer) a group of its own."""
    import re

    groups: dict[str, list[str]] = {}
    for name in names:
        found = re.match(r"^.*?\.\d+\.", name)
        groups.setdefault(found.group(0) if found else name, []).append(name)
    return list(groups.values())


__all__ = ["rank_sources", "freeze_rank", "chosen_parameters", "saved_modules", "lora_kinds", "load_rank", "fill_rank"]
