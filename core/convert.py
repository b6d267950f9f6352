"""The converter engine: Hugging Face safetensors <-> torch distributed checkpoint (DCP), streamed.

* HF -> DCP plans every output tensor from the safetensors headers alone (meta tensors), then
  lets ``torch.distributed.checkpoint.save`` pull each tensor through the pack's adapter only
  when it writes it: memory holds about one tensor, not a file, not the model.
* DCP -> HF reads one output shard's tensors at a time (``max_shard_bytes``) and writes
  safetensors shards plus ``model.safetensors.index.json``.
* The DCP output reshards at load: FSDP2 at any world size loads it with ``dcp.load``.

A pack supplies only a :class:`StateDictAdapter` (renames; fused or split tensors through
:class:`Recipe`). Keys in the DCP are ``"model." + <fqn in the training model>``.
"""

from __future__ import annotations

import warnings

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from mmcore.errors import StageError

if TYPE_CHECKING:
    import torch

# dcp.save/load without a process group is what we mean here: not worth a warning.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

MODEL_PREFIX = "model."
SAFE_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: "torch.dtype"


@dataclass(frozen=True)
class Recipe:
    """How to make one output tensor: from ``sources`` (input keys), combined by ``combine``.

    ``combine`` receives the source tensors in order and returns the output tensor; None
    means the single source is used as is. ``info`` is the output's shape and dtype, needed
    to plan the write before any tensor is read.
    """

    sources: tuple[str, ...]
    info: TensorInfo
    combine: Callable[..., "torch.Tensor"] | None = None


class StateDictAdapter:
    """Maps checkpoint tensors between the Hugging Face layout and the training model's."""

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        raise NotImplementedError

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        raise NotImplementedError


@dataclass
class RenameAdapter(StateDictAdapter):
    """An adapter that only renames, by ordered regex rules (first match wins, both ways).

    ``rules`` are ``(hf_pattern, mm_replacement, mm_pattern, hf_replacement)``.
    """

    rules: Sequence[tuple[str, str, str, str]] = field(default_factory=list)

    def _rename(self, key: str, forward: bool) -> str:
        for hf_pat, mm_rep, mm_pat, hf_rep in self.rules:
            pattern, replacement = (hf_pat, mm_rep) if forward else (mm_pat, hf_rep)
            if re.match(pattern, key):
                return re.sub(pattern, replacement, key, count=1)
        return key

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        return _renamed(hf, lambda k: self._rename(k, True))

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        return _renamed(mm, lambda k: self._rename(k, False))


def _renamed(index: dict[str, TensorInfo], rename: Callable[[str], str]) -> dict[str, Recipe]:
    out: dict[str, Recipe] = {}
    for key, info in index.items():
        new = rename(key)
        if new in out:
            raise StageError(f"adapter maps two tensors to {new!r} (one of them {key!r})")
        out[new] = Recipe((key,), info)
    return out


# --------------------------------------------------------------------------- reading HF


def _dtype(name: str) -> "torch.dtype":
    import torch

    table = {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
        "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    }
    try:
        return table[name]
    except KeyError:
        raise StageError(f"unsupported safetensors dtype {name}") from None


def safetensors_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise StageError(f"{folder}: no .safetensors files")
    return files


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor shapes and dtypes from a safetensors header, without reading any tensor."""
    import struct

    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise StageError(f"{path}: not a readable safetensors file ({exc})") from None
    header.pop("__metadata__", None)
    return {key: TensorInfo(tuple(v["shape"]), _dtype(v["dtype"])) for key, v in header.items()}


class SafetensorsFolder:
    """Lazy access to every tensor of a folder of safetensors files (mmap, one tensor at a time)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.where: dict[str, Path] = {}
        self.index: dict[str, TensorInfo] = {}
        for path in safetensors_files(folder):
            for key, info in read_header(path).items():
                if key in self.where:
                    raise StageError(f"{folder}: tensor {key!r} is in both {self.where[key].name} and {path.name}")
                self.where[key] = path
                self.index[key] = info
        self._handles: dict[Path, Any] = {}

    def get(self, key: str) -> "torch.Tensor":
        from safetensors import safe_open

        path = self.where[key]
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = safe_open(str(path), framework="pt")
        return handle.get_tensor(key)

    def close(self) -> None:
        self._handles.clear()


def _materialize(recipe: Recipe, fetch: Callable[[str], "torch.Tensor"]) -> "torch.Tensor":
    tensors = [fetch(key) for key in recipe.sources]
    out = recipe.combine(*tensors) if recipe.combine else tensors[0]
    if tuple(out.shape) != recipe.info.shape or out.dtype != recipe.info.dtype:
        raise StageError(f"adapter produced {tuple(out.shape)} {out.dtype} for {recipe.sources}, planned {recipe.info.shape} {recipe.info.dtype}")
    return out


# --------------------------------------------------------------------------- HF -> DCP


def hf_to_dcp(hf_dir: Path, out_dir: Path, adapter: StateDictAdapter, *, progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None) -> dict[str, Any]:
    """Convert a folder of HF safetensors into a DCP checkpoint at ``out_dir``; returns stats."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    source = SafetensorsFolder(hf_dir)
    plan = adapter.to_mm(source.index)
    flat = {MODEL_PREFIX + key: torch.empty(r.info.shape, dtype=r.info.dtype, device="meta") for key, r in plan.items()}
    recipes = {MODEL_PREFIX + key: r for key, r in plan.items()}
    ticker = iter(progress(range(len(flat))) if progress else range(len(flat)))

    class StreamingPlanner(DefaultSavePlanner):
        """Plans from meta tensors; reads each real tensor only when the writer asks for it."""

        def resolve_data(self, write_item):  # type: ignore[no-untyped-def]
            fqn = write_item.index.fqn
            if fqn in recipes:
                next(ticker, None)
                return _materialize(recipes[fqn], source.get)
            return super().resolve_data(write_item)

    out_dir.mkdir(parents=True, exist_ok=True)
    dcp.save(flat, storage_writer=FileSystemWriter(str(out_dir), single_file_per_rank=True, thread_count=1), planner=StreamingPlanner(flatten_state_dict=False), no_dist=True)
    for _ in ticker:
        pass
    source.close()
    total = sum(_nbytes(r.info) for r in plan.values())
    return {"tensors": len(plan), "bytes": total}


def _nbytes(info: TensorInfo) -> int:
    import math

    import torch

    return math.prod(info.shape) * torch.empty((), dtype=info.dtype).element_size()


# --------------------------------------------------------------------------- DCP -> HF


def dcp_index(ckpt_dir: Path, prefix: str = MODEL_PREFIX) -> dict[str, TensorInfo]:
    """Tensors under ``prefix`` in a DCP checkpoint, from its metadata (no tensor read)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = FileSystemReader(str(ckpt_dir)).read_metadata()
    except (OSError, ValueError, EOFError) as exc:
        raise StageError(f"{ckpt_dir}: not a readable torch distributed checkpoint ({exc})") from None
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata):
            out[key[len(prefix) :]] = TensorInfo(tuple(meta.size), meta.properties.dtype)
    if not out:
        raise StageError(f"{ckpt_dir}: no model tensors (keys starting {prefix!r}) in the checkpoint")
    return out


def load_dcp_tensors(ckpt_dir: Path, keys: Iterable[str], index: dict[str, TensorInfo], prefix: str = MODEL_PREFIX) -> dict[str, "torch.Tensor"]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    wanted = {prefix + k: torch.empty(index[k].shape, dtype=index[k].dtype) for k in keys}
    dcp.load(wanted, storage_reader=FileSystemReader(str(ckpt_dir)), no_dist=True)
    return {k[len(prefix) :]: v for k, v in wanted.items()}


def _shard_groups(plan: dict[str, Recipe], max_shard_bytes: int) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    size = 0
    for key in plan:
        nbytes = _nbytes(plan[key].info)
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += nbytes
    return groups


def dcp_to_hf(
    ckpt_dir: Path,
    out_dir: Path,
    adapter: StateDictAdapter,
    *,
    max_shard_bytes: int = 4 << 30,
    dtype: "torch.dtype | None" = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> dict[str, Any]:
    """Write the model tensors of a DCP checkpoint as HF safetensors shards (+ index if several)."""
    from safetensors.torch import save_file

    mm_index = dcp_index(ckpt_dir)
    plan = adapter.to_hf(mm_index)
    groups = _shard_groups(plan, max_shard_bytes)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = ["model.safetensors"] if len(groups) == 1 else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map: dict[str, str] = {}
    total = 0
    for name, group in zip(names, progress(groups) if progress else groups):
        needed = sorted({src for key in group for src in plan[key].sources})
        loaded = load_dcp_tensors(ckpt_dir, needed, mm_index)
        tensors = {}
        for key in group:
            tensor = _materialize(plan[key], loaded.__getitem__)
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            tensors[key] = tensor.contiguous()
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()
        save_file(tensors, str(out_dir / name), metadata={"format": "pt"})
        del loaded, tensors
    if len(names) > 1:
        (out_dir / SAFE_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return {"tensors": len(plan), "bytes": total, "shards": len(names)}


# --------------------------------------------------------------------------- verification


def iter_pairs(a: SafetensorsFolder, b: SafetensorsFolder) -> Iterator[tuple[str, "torch.Tensor | None", "torch.Tensor | None"]]:
    for key in sorted(set(a.index) | set(b.index)):
        yield key, a.get(key) if key in a.index else None, b.get(key) if key in b.index else None


def compare_hf(a_dir: Path, b_dir: Path) -> list[str]:
    """Every difference between two folders of safetensors: missing keys, dtype, shape, bits."""
    import torch

    problems = []
    a, b = SafetensorsFolder(a_dir), SafetensorsFolder(b_dir)
    for key, x, y in iter_pairs(a, b):
        if x is None or y is None:
            problems.append(f"{key}: only in {'the second' if x is None else 'the first'} checkpoint")
        elif x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{key}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
        elif not torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)):
            problems.append(f"{key}: values differ")
    return problems
