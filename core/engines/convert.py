"""The converter engine: Hugging Face safetensors <-> torch distributed checkpoint (DCP), streamed.

* HF -> DCP plans every output tensor from the safetensors headers alone (meta tensors), then
  lets ``torch.distributed.checkpoint.save`` pull each tensor through the pack's adapter only
  when it writes it: memory holds about one tensor per writer thread, not a file, not the model.
  Two threads read, build and write tensors side by side; files are flushed to disk once, at
  the end, instead of one ``fsync`` per tensor; and torch's per-record CRC32 is not computed
  (the stage's manifest already records every output file's sha256). Speed and memory:
  ``bench/convert_speed.py``, figures in BENCHMARKS.md.
* DCP -> HF writes safetensors shards (``max_shard_bytes``) plus ``model.safetensors.index.json``
  tensor by tensor: a tensor stored whole in its own file (convert's output) is memory-mapped,
  the others (training checkpoints' shards) are read ``read_bytes`` at a time through
  ``dcp.load``, so peak memory stays near the largest tensor, not the checkpoint.
* The DCP output reshards at load: FSDP2 at any world size loads it with ``dcp.load``.
* The convert stage checks key coverage: the converted tensors are exactly the training
  model's (tied weights once), with its shapes, before anything trains.

A pack supplies only a :class:`~mmcore.engines.state_dict.StateDictAdapter` (renames; fused or split
tensors through :class:`~mmcore.engines.state_dict.Recipe`) and a function that builds its training
model from the downloaded folder. Keys in the DCP are ``"model." + <fqn in the training model>``.
"""

from __future__ import annotations

from collections import Counter

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from mmcore.engines import convert_bytes
from mmcore.engines.state_dict import FusedExpertsAdapter, Recipe, RenameAdapter, StateDictAdapter, TensorInfo, materialize
from mmcore.engines.coverage import build_on_meta, coverage_problems, expected_tensors, model_from_config
from mmcore.checkpoint.dcp_tensors import MODEL_PREFIX, dcp_index, load_dcp_tensors, read_whole_tensor, whole_tensor_files
from mmcore.errors import StageError
from mmcore.framework.faults import crash_point
from mmcore.framework.files import ensure_free_space, fsync_tree
from mmcore.checkpoint.safetensors_files import SAFE_INDEX, SafetensorsFolder, compare_hf, iter_pairs, nbytes, read_header, safetensors_files, write_safetensors_streaming

if TYPE_CHECKING:
    import torch
    from torch import nn

    from mmcore.framework.context import StageContext
    from mmcore.framework.pack import StageResult
    from mmcore.run.rundir import Manifest

# dcp.save/load without a process group is what we mean here: not worth a warning.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


# --------------------------------------------------------------------------- HF -> DCP

#: Threads that read, build and write tensors at once: each holds about one tensor in memory.
WRITER_THREADS = 2


def hf_to_dcp(hf_dir: Path, out_dir: Path, adapter: StateDictAdapter, *, progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None) -> dict[str, Any]:
    """Convert a folder of HF safetensors into a DCP checkpoint at ``out_dir``; returns stats.
    A renaming adapter copies bytes without torch (:mod:`mmcore.engines.convert_bytes`)."""
    copied = convert_bytes.hf_to_dcp(hf_dir, out_dir, adapter, progress=progress)
    if copied is not None:
        return copied
    import threading

    import torch
    import torch.distributed.checkpoint as dcp
    import torch.utils.serialization
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    source = SafetensorsFolder(hf_dir)
    plan = adapter.to_mm(source.index)
    flat = {MODEL_PREFIX + key: torch.empty(r.info.shape, dtype=r.info.dtype, device="meta") for key, r in plan.items()}
    recipes = {MODEL_PREFIX + key: r for key, r in plan.items()}
    ticker = iter(progress(range(len(flat))) if progress else range(len(flat)))
    written: list[str] = []
    lock = threading.Lock()  # the writer threads share the progress bar and the crash-point count

    class StreamingPlanner(DefaultSavePlanner):
        """Plans from meta tensors; reads each real tensor only when the writer asks for it."""

        def resolve_data(self, write_item):  # type: ignore[no-untyped-def]
            fqn = write_item.index.fqn
            if fqn in recipes:
                with lock:
                    next(ticker, None)
                    crash_point("convert-tensor", len(written) + 1)
                    written.append(fqn)
                return materialize(recipes[fqn], source.get)
            return super().resolve_data(write_item)

    out_dir.mkdir(parents=True, exist_ok=True)
    ensure_free_space(out_dir, sum(nbytes(r.info) for r in plan.values()), "the converted checkpoint")
    # One file per tensor: with a single file per rank, torch's writer keeps a reference to
    # every tensor written to that file until it closes, i.e. the whole model (torch 2.13).
    writer = FileSystemWriter(str(out_dir), single_file_per_rank=False, thread_count=WRITER_THREADS, sync_files=False)
    with torch.utils.serialization.config.patch({"save.compute_crc32": False}):
        dcp.save(flat, storage_writer=writer, planner=StreamingPlanner(flatten_state_dict=False), no_dist=True)
    fsync_tree(out_dir)
    for _ in ticker:
        pass
    source.close()
    total = sum(nbytes(r.info) for r in plan.values())
    return {"tensors": len(plan), "bytes": total}


# --------------------------------------------------------------------------- DCP -> HF


def _shard_groups(plan: dict[str, Recipe], max_shard_bytes: int) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    size = 0
    for key in plan:
        tensor_bytes = nbytes(plan[key].info)
        if groups[-1] and size + tensor_bytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += tensor_bytes
    return groups


def dcp_to_hf(
    ckpt_dir: Path,
    out_dir: Path,
    adapter: StateDictAdapter,
    *,
    max_shard_bytes: int = 4 << 30,
    dtype: "torch.dtype | None" = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    read_bytes: int = 256 << 20,
) -> dict[str, Any]:
    """Write the model tensors of a DCP checkpoint as HF safetensors shards (+ index if several).

    Tensors are read ``read_bytes`` at a time, built by the adapter and written one by one:
    memory holds about ``max(read_bytes, largest tensor)``, whatever the shard size. A renaming
    adapter on whole tensors copies bytes without torch (:mod:`mmcore.engines.convert_bytes`).
    """
    copied = convert_bytes.dcp_to_hf(ckpt_dir, out_dir, adapter, max_shard_bytes=max_shard_bytes, dtype=dtype, progress=progress)
    if copied is not None:
        return copied
    mm_index = dcp_index(ckpt_dir)
    plan = adapter.to_hf(mm_index)
    if dtype is not None:
        plan = {k: Recipe(r.sources, TensorInfo(r.info.shape, dtype if r.info.dtype.is_floating_point else r.info.dtype), r.combine) for k, r in plan.items()}
    groups = _shard_groups(plan, max_shard_bytes)
    out_dir.mkdir(parents=True, exist_ok=True)
    ensure_free_space(out_dir, sum(nbytes(r.info) for r in plan.values()), "the exported model")
    names = ["model.safetensors"] if len(groups) == 1 else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]

    order = [key for group in groups for key in group]
    position = {key: i for i, key in enumerate(order)}
    loaded: dict[str, "torch.Tensor"] = {}
    whole = whole_tensor_files(ckpt_dir)
    # a source several outputs are cut from (fused MoE experts split per expert) is read once
    # and kept until its last use
    uses = Counter(src for recipe in plan.values() for src in recipe.sources)

    def produce(key: str) -> "torch.Tensor":
        # Tensors stored whole in their own file are mapped; the others are read a few at a
        # time in one dcp.load (each call re-reads the checkpoint's metadata), up to
        # read_bytes; a tensor larger than that is read alone.
        recipe = plan[key]
        if all(src in whole for src in recipe.sources):
            sources = [read_whole_tensor(whole[src], mm_index[src]) for src in recipe.sources]
            tensor = recipe.combine(*sources) if recipe.combine else sources[0]
            return tensor.to(recipe.info.dtype)
        if any(src not in loaded for src in recipe.sources):
            wanted: list[str] = []
            size = sum(nbytes(mm_index[s]) for s in loaded)  # what is kept for later uses
            for upcoming in order[position[key] :]:
                if all(src in whole for src in plan[upcoming].sources):
                    continue
                sources = [s for s in plan[upcoming].sources if s not in wanted and s not in loaded]
                extra = sum(nbytes(mm_index[s]) for s in sources)
                if wanted and size + extra > read_bytes:
                    break
                wanted += sources
                size += extra
            loaded.update(load_dcp_tensors(ckpt_dir, wanted, mm_index))
        tensor = recipe.combine(*(loaded[s] for s in recipe.sources)) if recipe.combine else loaded[recipe.sources[0]]
        for src in recipe.sources:
            uses[src] -= 1
            if uses[src] <= 0:
                loaded.pop(src, None)  # released after its last use
        return tensor.to(recipe.info.dtype)

    def write(name: str, group: list[str]) -> int:
        return write_safetensors_streaming(out_dir / name, {key: plan[key].info for key in group}, produce)

    weight_map = {key: name for name, group in zip(names, groups) for key in group}
    ticks = iter(progress(groups) if progress else groups)
    if len(groups) > 1 and all(src in whole for recipe in plan.values() for src in recipe.sources):
        # every source is mapped, nothing shared between shards: write WRITER_THREADS shards at once
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(WRITER_THREADS) as pool:
            futures = [pool.submit(write, name, group) for name, group in zip(names, groups)]
            total = 0
            for future in futures:
                total += future.result()
                next(ticks, None)
    else:
        total = sum(write(name, group) for name, group, _ in zip(names, groups, ticks))
    if len(names) > 1:
        (out_dir / SAFE_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return {"tensors": len(plan), "bytes": total, "shards": len(names)}


# --------------------------------------------------------------------------- the stage


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def link_root(model_dir: Path) -> Path:
    """Where links in a model folder may point: the folder, or for a hub cache snapshot
    (``.../snapshots/<commit>/``, whose files are links to ``../../blobs/``) its repository's
    cache folder."""
    folder = model_dir.resolve()
    return folder.parent.parent if folder.parent.name == "snapshots" else folder


def refuse_links_out(model_dir: Path) -> None:
    """A link in ``model_dir`` (at any depth) that resolves outside it is refused: copied into
    the export, it would carry a file from elsewhere on the machine (a key, a password file)
    into what gets published. Links inside the folder are fine: they are copied as content."""
    import os

    root = link_root(model_dir)
    for folder, dirs, files in os.walk(model_dir):
        for name in sorted([*dirs, *files]):
            path = Path(folder) / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise StageError(
                    f"{path}: a link to {path.resolve()}, outside the model folder {model_dir}; refused, so that no file from elsewhere is copied into the export",
                    hint="copy the file into the model folder if it belongs to the model",
                )


def copy_side_files(model_dir: Path, out: Path) -> None:
    """Config, tokenizer, processor, generation and template files: everything but the weights;
    a link is copied as its content, and refused where it leads out of the folder."""
    import shutil

    refuse_links_out(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and path.name != SAFE_INDEX:
            shutil.copy2(path, out / path.name)


def convert_stage(
    ctx: "StageContext",
    upstream: "Mapping[str, Manifest] | Path",
    legacy_adapter: StateDictAdapter | None = None,
    *,
    adapter: StateDictAdapter | None = None,
    build_model: Callable[[Path], "nn.Module"] | None = None,
    subfolder: str = "",
    what: str = "model",
    parallel_map: "Callable[[Path], Any] | None" = None,
) -> "StageResult":
    """The convert stage: stream the downloaded safetensors to ``<stage>/dcp`` through
    ``adapter``, after checking that they cover exactly the tensors of the model
    ``build_model(download folder)`` builds (on the meta device); with ``convert.verify``,
    convert back and require every tensor to be bit-identical.

    Bind it in a pack's declared stages::

        "convert": Stage("mmcore.engines.convert:convert_stage", parts={"adapter": "mm_pack_x.adapter:ADAPTER",
                                                               "build_model": "mm_pack_x.model:build_model"})

    ``subfolder``: where the weights are inside the download (``"transformer"`` for a
    diffusers pipeline); ``what`` names them in the notes. Without ``build_model`` the model
    is the class the folder's ``config.json`` names (``architectures``), where transformers has it.

    ``parallel_map``: ``model folder -> ParallelMap``, the pack's Megatron table
    (:mod:`mmcore.backends.megatron.tensor_map`); with it, ``convert.mindspeed_mm`` imports the weights of a
    MindSpeed-MM checkpoint (any TP/PP) in place of the downloaded ones
    (:func:`mmcore.backends.megatron.mindspeed_mm.import_mindspeed`).

    The SDK 1.0 call from a pack's own hook, ``convert_stage(ctx, source_folder, adapter)``,
    still works (coverage then against the class ``config.json`` names).
    """
    import shutil

    from mmcore.framework.pack import StageResult

    if isinstance(upstream, Path):
        model_dir = source = upstream
        adapter = adapter or legacy_adapter
    else:
        model_dir = upstream["download"].output("model")
        source = model_dir / subfolder if subfolder else model_dir
    if adapter is None:
        raise TypeError("convert_stage needs an adapter")
    imported_note = None
    mindspeed = getattr(ctx.config.convert, "mindspeed_mm", None)
    if mindspeed:
        from mmcore.backends.megatron.mindspeed_mm import import_mindspeed

        if parallel_map is None:
            raise StageError(f"convert.mindspeed_mm: the {ctx.pack} pack has no Megatron table to read a MindSpeed-MM checkpoint with")
        source, imported_note = import_mindspeed(ctx, Path(mindspeed).expanduser(), model_dir, parallel_map)
    planned = {key: recipe.info for key, recipe in adapter.to_mm(SafetensorsFolder(source).index).items()}
    model = build_on_meta(build_model, model_dir) if build_model is not None else model_from_config(source)
    if model is not None:
        expected, aliases = expected_tensors(model)
        problems = coverage_problems(planned, expected, aliases)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise StageError(f"{source}: the converted checkpoint would not fit the training model: {problems[0]}{more}")
        coverage = f"key coverage: the {len(expected)} tensors of the training model, no more, shapes equal"
    else:
        coverage = "key coverage NOT checked: no build_model given and config.json names no transformers class"
    out = ctx.stage_dir / "dcp"
    stats = hf_to_dcp(source, out, adapter, progress=lambda it: ctx.progress(it, description="convert", unit="tensor"))
    notes = [*([imported_note] if imported_note else []), f"{what}: {stats['tensors']} tensors, {stats['bytes'] / 2**20:.1f} MiB -> {out}", coverage]
    if ctx.config.convert.verify:
        back = ctx.stage_dir / "verify"
        dcp_to_hf(out, back, adapter)
        mismatches = compare_hf(source, back, getattr(adapter, "round_trip_name", lambda k: k), getattr(adapter, "round_trip_tensor", lambda k, t: t))
        shutil.rmtree(back)
        if mismatches:
            raise StageError(f"round trip to mmcore and back is not exact: {mismatches[0]}" + (f" (+{len(mismatches) - 1} more)" if len(mismatches) > 1 else ""))
        notes.append("verified: the round trip to mmcore and back is bit-identical for every tensor")
    if imported_note:
        shutil.rmtree(source)  # the DCP holds the weights now
    return StageResult(outputs={"checkpoint": "dcp"}, metrics={**stats, "verified": ctx.config.convert.verify}, notes=notes)


__all__ = [
    "MODEL_PREFIX",
    "SAFE_INDEX",
    "TensorInfo",
    "Recipe",
    "StateDictAdapter",
    "RenameAdapter",
    "FusedExpertsAdapter",
    "SafetensorsFolder",
    "hf_to_dcp",
    "dcp_to_hf",
    "dcp_index",
    "load_dcp_tensors",
    "compare_hf",
    "copy_side_files",
    "expected_tensors",
    "coverage_problems",
    "model_from_config",
    "convert_stage",
    "read_header",
    "safetensors_files",
    "iter_pairs",
    "write_safetensors_streaming",
]
