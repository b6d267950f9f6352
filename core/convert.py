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

    ``rules`` are ``(hf_pattern, mm_replacement, mm_pattern, hf_replacement)``. ``ignore`` are
    patterns of hub tensors left out on the way in (parts of a checkpoint another model uses).
    ``tied`` names
    training-model tensors that hub checkpoints do not store because they share another's
    storage (an output projection tied to the embedding); exports leave them out too.
    """

    rules: Sequence[tuple[str, str, str, str]] = field(default_factory=list)
    tied: Sequence[str] = field(default_factory=list)
    ignore: Sequence[str] = field(default_factory=list)  # hub tensors the training model does not have

    def _ignored(self, key: str) -> bool:
        return any(re.match(pattern, key) for pattern in self.ignore)

    def round_trip_name(self, hub_key: str) -> str | None:
        """The name a hub tensor gets after conversion in and back out (None: left out)."""
        return None if self._ignored(hub_key) else self._rename(self._rename(hub_key, True), False)

    def _rename(self, key: str, forward: bool) -> str:
        for hf_pat, mm_rep, mm_pat, hf_rep in self.rules:
            pattern, replacement = (hf_pat, mm_rep) if forward else (mm_pat, hf_rep)
            if re.match(pattern, key):
                return re.sub(pattern, replacement, key, count=1)
        return key

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        return _renamed({k: v for k, v in hf.items() if not self._ignored(k)}, lambda k: self._rename(k, True))

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        return _renamed({k: v for k, v in mm.items() if k not in self.tied}, lambda k: self._rename(k, False))


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


def _read_raw_header(path: Path) -> tuple[dict[str, Any], int]:
    import struct

    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise StageError(f"{path}: not a readable safetensors file ({exc})") from None
    header.pop("__metadata__", None)
    return header, 8 + length


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor shapes and dtypes from a safetensors header, without reading any tensor."""
    header, _ = _read_raw_header(path)
    return {key: TensorInfo(tuple(v["shape"]), _dtype(v["dtype"])) for key, v in header.items()}


class SafetensorsFolder:
    """Every tensor of a folder of safetensors files, read one at a time with plain file reads.

    Reads copy the bytes into a fresh tensor instead of memory-mapping the file: a mapping
    keeps every page it touched resident, so converting a model through mmap grows the
    process to the size of the checkpoint. This way memory holds one tensor at a time.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.where: dict[str, tuple[Path, int, int]] = {}
        self.index: dict[str, TensorInfo] = {}
        for path in safetensors_files(folder):
            header, data_start = _read_raw_header(path)
            for key, entry in header.items():
                if key in self.where:
                    raise StageError(f"{folder}: tensor {key!r} is in both {self.where[key][0].name} and {path.name}")
                begin, end = entry["data_offsets"]
                self.where[key] = (path, data_start + begin, end - begin)
                self.index[key] = TensorInfo(tuple(entry["shape"]), _dtype(entry["dtype"]))

    def get(self, key: str) -> "torch.Tensor":
        import torch

        path, offset, nbytes = self.where[key]
        info = self.index[key]
        out = torch.empty(info.shape, dtype=info.dtype)
        raw = out.view(-1).view(torch.uint8) if out.dim() else out.reshape(1).view(torch.uint8)
        if raw.numel() != nbytes:
            raise StageError(f"{path}: tensor {key!r} has {nbytes} bytes, expected {raw.numel()} for {info.shape} {info.dtype}")
        with open(path, "rb") as handle:
            handle.seek(offset)
            if handle.readinto(memoryview(raw.numpy())) != nbytes:
                raise StageError(f"{path}: truncated inside tensor {key!r}")
        return out

    def close(self) -> None:
        """Nothing is held open; kept for symmetry with readers that do."""


_SAFETENSORS_DTYPE = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def write_safetensors_streaming(path: Path, infos: dict[str, TensorInfo], produce: Callable[[str], "torch.Tensor"]) -> int:
    """Write a safetensors file tensor by tensor: the header first (from ``infos``), then each
    tensor's bytes as ``produce(key)`` returns it, so only one tensor is in memory at a time."""
    import torch

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, info in infos.items():
        nbytes = _nbytes(info)
        header[key] = {"dtype": _SAFETENSORS_DTYPE[str(info.dtype).removeprefix("torch.")], "shape": list(info.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(len(blob).to_bytes(8, "little"))
        handle.write(blob)
        for key, info in infos.items():
            tensor = produce(key).contiguous()
            if tuple(tensor.shape) != info.shape or tensor.dtype != info.dtype:
                raise StageError(f"{key}: produced {tuple(tensor.shape)} {tensor.dtype}, planned {info.shape} {info.dtype}")
            flat = tensor.view(-1) if tensor.dim() else tensor.reshape(1)
            handle.write(memoryview(flat.view(torch.uint8).numpy()))
            del tensor, flat
    tmp.replace(path)
    return offset


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
    # One file per tensor: with a single file per rank, torch's writer keeps a reference to
    # every tensor written to that file until it closes, i.e. the whole model (torch 2.13).
    writer = FileSystemWriter(str(out_dir), single_file_per_rank=False, thread_count=1)
    dcp.save(flat, storage_writer=writer, planner=StreamingPlanner(flatten_state_dict=False), no_dist=True)
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
    read_bytes: int = 256 << 20,
) -> dict[str, Any]:
    """Write the model tensors of a DCP checkpoint as HF safetensors shards (+ index if several).

    Tensors are read ``read_bytes`` at a time, built by the adapter and written one by one:
    memory holds about ``max(read_bytes, largest tensor)``, whatever the shard size.
    """
    mm_index = dcp_index(ckpt_dir)
    plan = adapter.to_hf(mm_index)
    if dtype is not None:
        plan = {k: Recipe(r.sources, TensorInfo(r.info.shape, dtype if r.info.dtype.is_floating_point else r.info.dtype), r.combine) for k, r in plan.items()}
    groups = _shard_groups(plan, max_shard_bytes)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = ["model.safetensors"] if len(groups) == 1 else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]

    order = [key for group in groups for key in group]
    position = {key: i for i, key in enumerate(order)}
    loaded: dict[str, "torch.Tensor"] = {}

    def produce(key: str) -> "torch.Tensor":
        # Read the sources of the next few tensors in one dcp.load (each call re-reads the
        # checkpoint's metadata), up to read_bytes; a tensor larger than that is read alone.
        recipe = plan[key]
        if any(src not in loaded for src in recipe.sources):
            loaded.clear()
            wanted: list[str] = []
            size = 0
            for upcoming in order[position[key] :]:
                sources = [s for s in plan[upcoming].sources if s not in wanted]
                extra = sum(_nbytes(mm_index[s]) for s in sources)
                if wanted and size + extra > read_bytes:
                    break
                wanted += sources
                size += extra
            loaded.update(load_dcp_tensors(ckpt_dir, wanted, mm_index))
        tensor = recipe.combine(*(loaded[s] for s in recipe.sources)) if recipe.combine else loaded[recipe.sources[0]]
        for src in recipe.sources:
            loaded.pop(src, None)  # single-use: release as soon as it is written
        return tensor.to(recipe.info.dtype)

    weight_map: dict[str, str] = {}
    total = 0
    for name, group in zip(names, progress(groups) if progress else groups):
        total += write_safetensors_streaming(out_dir / name, {key: plan[key].info for key in group}, produce)
        weight_map.update({key: name for key in group})
    if len(names) > 1:
        (out_dir / SAFE_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return {"tensors": len(plan), "bytes": total, "shards": len(names)}


# --------------------------------------------------------------------------- verification


def iter_pairs(a: SafetensorsFolder, b: SafetensorsFolder, name_in_b: Callable[[str], str | None] = lambda k: k) -> Iterator[tuple[str, "torch.Tensor | None", "torch.Tensor | None"]]:
    mapped = {key: name_in_b(key) for key in a.index}
    matched = {m for m in mapped.values() if m is not None}
    for key in sorted(k for k, m in mapped.items() if m is not None):
        other = mapped[key]
        yield key, a.get(key), b.get(other) if other in b.index else None
    for key in sorted(set(b.index) - matched):
        yield key, None, b.get(key)


def compare_hf(a_dir: Path, b_dir: Path, name_in_b: Callable[[str], str | None] = lambda k: k) -> list[str]:
    """Every difference between two folders of safetensors: missing keys, dtype, shape, bits.

    ``name_in_b`` maps a tensor name of ``a`` to its name in ``b`` (None: not expected there),
    for adapters that drop or rename on the way back (see :meth:`RenameAdapter.round_trip_name`).
    """
    import torch

    problems = []
    a, b = SafetensorsFolder(a_dir), SafetensorsFolder(b_dir)
    for key, x, y in iter_pairs(a, b, name_in_b):
        if x is None or y is None:
            problems.append(f"{key}: only in {'the second' if x is None else 'the first'} checkpoint")
        elif x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{key}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
        elif not torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)):
            problems.append(f"{key}: values differ")
    return problems


# --------------------------------------------------------------------------- the stage

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def copy_side_files(model_dir: Path, out: Path) -> None:
    """Config, tokenizer, processor, generation and template files: everything but the weights."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and path.name != SAFE_INDEX:
            shutil.copy2(path, out / path.name)



def convert_stage(ctx: Any, source: Path, adapter: StateDictAdapter, *, what: str = "model") -> Any:
    """The whole convert stage for a folder of safetensors: stream to ``<stage>/dcp`` and, with
    ``convert.verify``, convert back and require every tensor to be bit-identical."""
    import shutil

    from mmcore.pack import StageResult

    out = ctx.stage_dir / "dcp"
    stats = hf_to_dcp(source, out, adapter, progress=lambda it: ctx.progress(it, description="convert", unit="tensor"))
    notes = [f"{what}: {stats['tensors']} tensors, {stats['bytes'] / 2**20:.1f} MiB -> {out}"]
    if ctx.config.convert.verify:
        back = ctx.stage_dir / "verify"
        dcp_to_hf(out, back, adapter)
        problems = compare_hf(source, back, getattr(adapter, "round_trip_name", lambda k: k))
        shutil.rmtree(back)
        if problems:
            raise StageError(f"round trip to mmcore and back is not exact: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        notes.append("verified: the round trip to mmcore and back is bit-identical for every tensor")
    return StageResult(outputs={"checkpoint": "dcp"}, metrics={**stats, "verified": ctx.config.convert.verify}, notes=notes)
