"""Conversions that only rename, done by copying bytes, without torch.

With a plain :class:`~mmcore.engines.state_dict.RenameAdapter` every output tensor is one input
tensor under another name, with its dtype, shape and bytes: HF -> DCP writes each into a
``torch.save`` archive of its own (the bytes copied file to file, ``copy_file_range``) and
DCP -> HF each into a safetensors shard written past the page cache
(:mod:`mmcore.framework.direct_write`); the formats are written by :mod:`mmcore.checkpoint.dcp_files`.
The files are those torch's path writes (the same layout, names and headers), so either path
reads what the other wrote. Anything else (fused or split tensors, a dtype cast, a sharded or
transformed checkpoint, a dtype or size the archive writer does not cover) returns None here
and takes the torch path in :mod:`mmcore.engines.convert`.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

from mmcore.checkpoint.dcp_files import DTYPES, MAX_RECORD, metadata_pickle, whole_tensors, write_tensor_file
from mmcore.engines.state_dict import RenameAdapter, StateDictAdapter, TensorInfo
from mmcore.errors import StageError
from mmcore.framework.direct_write import DirectFile
from mmcore.framework.faults import crash_point
from mmcore.framework.files import ensure_free_space, fsync_dir, fsync_tree

MODEL_PREFIX = "model."  # as mmcore.checkpoint.dcp_tensors (which imports torch to read)
T = TypeVar("T")


def _renames(adapter: StateDictAdapter) -> bool:
    return type(adapter) is RenameAdapter


def _size(code: str, shape: tuple[int, ...]) -> int:
    n = DTYPES[code][2]
    for dim in shape:
        n *= dim
    return n


def hf_to_dcp(hf_dir: Path, out_dir: Path, adapter: StateDictAdapter, *, progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None) -> dict[str, Any] | None:
    """:func:`mmcore.engines.convert.hf_to_dcp` for a renaming adapter; None where it does not apply."""
    from mmcore.checkpoint.safetensors_files import _read_raw_header, safetensors_files

    if not _renames(adapter):
        return None
    where: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
    for path in safetensors_files(hf_dir):
        header, start = _read_raw_header(path)
        for key, entry in header.items():
            if key in where:
                raise StageError(f"{hf_dir}: tensor {key!r} is in both {where[key][0].name} and {path.name}")
            begin, end = entry["data_offsets"]
            if entry["dtype"] not in DTYPES or end - begin > MAX_RECORD:
                return None
            where[key] = (path, entry["dtype"], tuple(entry["shape"]), start + begin, end - begin)
    plan = adapter.to_mm({key: TensorInfo(shape, code) for key, (_, code, shape, _, _) in where.items()})  # type: ignore[arg-type]
    out_dir.mkdir(parents=True, exist_ok=True)
    total = sum(where[r.sources[0]][4] for r in plan.values())
    ensure_free_space(out_dir, total, "the converted checkpoint")
    files: dict[Path, Any] = {}

    def write(i: int, key: str, source: str) -> tuple[str, tuple[str, tuple[int, ...], str, int]]:
        crash_point("convert-tensor", i + 1)
        path, code, shape, offset, nbytes = where[source]
        name = f"__0_{i}.distcp"
        return MODEL_PREFIX + key, (code, shape, name, write_tensor_file(out_dir / name, code, shape, files[path], offset, nbytes))

    try:
        for path in {where[recipe.sources[0]][0] for recipe in plan.values()}:
            files[path] = open(path, "rb")
        tensors = dict(in_parallel([partial(write, i, key, recipe.sources[0]) for i, (key, recipe) in enumerate(plan.items())], progress))
    finally:
        for handle in files.values():
            handle.close()
    tmp = out_dir / ".metadata.tmp"
    tmp.write_bytes(metadata_pickle(tensors, str(out_dir)))
    tmp.replace(out_dir / ".metadata")
    fsync_tree(out_dir)
    return {"tensors": len(plan), "bytes": total}


def dcp_to_hf(
    ckpt_dir: Path, out_dir: Path, adapter: StateDictAdapter, *, max_shard_bytes: int, dtype: Any = None, progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None
) -> dict[str, Any] | None:
    """:func:`mmcore.engines.convert.dcp_to_hf` for a renaming adapter, no dtype cast and a
    checkpoint of whole tensors; None where it does not apply."""
    from mmcore.checkpoint.safetensors_files import SAFE_INDEX

    if not _renames(adapter) or dtype is not None:
        return None
    stored = whole_tensors(ckpt_dir, MODEL_PREFIX)
    if stored is None:
        return None
    plan = adapter.to_hf({key: TensorInfo(shape, code) for key, (code, shape, *_) in stored.items()})  # type: ignore[arg-type]
    groups: list[list[str]] = [[]]  # as convert._shard_groups
    size = 0
    for key, recipe in plan.items():
        nbytes = stored[recipe.sources[0]][4]
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += nbytes
    out_dir.mkdir(parents=True, exist_ok=True)
    ensure_free_space(out_dir, sum(stored[r.sources[0]][4] for r in plan.values()), "the exported model")
    names = ["model.safetensors"] if len(groups) == 1 else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    written = [(out_dir / f".{name}.tmp", out_dir / name) for name in names]
    try:
        jobs = [partial(_write_shard, tmp, [(key, stored[plan[key].sources[0]]) for key in group]) for (tmp, _), group in zip(written, groups)]
        total = sum(in_parallel(jobs, progress))
        # flushed together at the end, as cp + sync: each shard's fsync in turn kept the kernel from
        # writing one shard back while the next was copied (4.1 GiB in 1 GiB shards: the flushes took
        # 1.6-1.9 s, now 0.8-0.9; bench/convert_speed.py)
        fsync_tree(out_dir)
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in written:  # only whole, durable shards get their names
        tmp.replace(final)
    fsync_dir(out_dir)
    if len(names) > 1:
        weight_map = {key: name for name, group in zip(names, groups) for key in group}
        (out_dir / SAFE_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return {"tensors": len(plan), "bytes": total, "shards": len(names)}


#: files copied at once. ``copy_file_range``, ``pread`` and ``pwrite`` release the GIL and the
#: kernel copies one file's pages on one core, as ``cp`` does; with the shards (or tensor files)
#: copied on two threads the copy goes on two cores (bench/convert_speed.py)
COPY_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def in_parallel(jobs: Sequence[Callable[[], T]], progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None) -> list[T]:
    """Every job's result, in order, the jobs run on :data:`COPY_THREADS` threads (``progress``
    counts them done in order); the first error is raised once the running jobs have stopped
    and the waiting ones were dropped."""
    if COPY_THREADS == 1 or len(jobs) <= 1:
        return [job() for job in (progress(jobs) if progress else jobs)]
    with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="mmcore-copy") as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            return [future.result() for future in (progress(futures) if progress else futures)]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _write_shard(path: Path, tensors: list[tuple[str, tuple[str, tuple[int, ...], Path, int, int]]]) -> int:
    """A safetensors file at ``path`` as :func:`~mmcore.checkpoint.safetensors_files.write_safetensors_streaming`
    writes it (the same header bytes), each tensor's bytes copied from its archive past the page
    cache (:class:`~mmcore.framework.direct_write.DirectFile`); not yet flushed."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, (code, shape, _, _, nbytes) in tensors:
        header[key] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    sources: dict[Path, int] = {}
    try:
        with DirectFile(path) as out:
            out.write(len(blob).to_bytes(8, "little") + blob)
            for _, (_, _, file, start, nbytes) in tensors:
                if file not in sources:
                    sources[file] = os.open(file, os.O_RDONLY)
                out.copy_from(sources[file], start, nbytes, file.name)
                crash_point("safetensors-tensor")
    finally:
        for fd in sources.values():
            os.close(fd)
    return offset


__all__ = ["hf_to_dcp", "dcp_to_hf"]
