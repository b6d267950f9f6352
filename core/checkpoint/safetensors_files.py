"""Safetensors files read and written one tensor at a time, and compared bit for bit.

No memory map and no whole-file load: converting or exporting a model holds about one tensor
in memory, whatever the checkpoint's size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from mmcore.engines.state_dict import TensorInfo
from mmcore.errors import StageError
from mmcore.framework.direct_write import DirectFile
from mmcore.framework.faults import crash_point
from mmcore.framework.files import fsync_dir

if TYPE_CHECKING:
    import torch

SAFE_INDEX = "model.safetensors.index.json"


def _dtype(name: str) -> "torch.dtype":
    import torch

    table = {
        "F64": torch.float64,
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E5M2": torch.float8_e5m2,
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


_ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
#: A header larger than this is not a header (safetensors itself refuses beyond 100 MB).
MAX_HEADER_BYTES = 100 << 20


def _read_raw_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header of a safetensors file, checked against the file: every tensor's byte range
    lies inside the data section, matches its shape and dtype, and the ranges cover the
    data section exactly (a truncated or padded file is refused here, naming the tensor)."""
    import struct

    def bad(why: str) -> StageError:
        return StageError(f"{path}: not a valid safetensors file: {why}")

    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            raw = handle.read(8)
            if len(raw) < 8:
                raise bad(f"{size} bytes, too short for a header")
            (length,) = struct.unpack("<Q", raw)
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise bad(f"header length {length} exceeds the file ({size} bytes): truncated or not safetensors")
            header = json.loads(handle.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"header is not JSON ({exc})") from None
    except OSError as exc:
        raise StageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - length
    end = 0
    for key, entry in header.items():
        try:
            dtype, shape, (start, stop) = entry["dtype"], entry["shape"], entry["data_offsets"]
            numel = 1
            for dim in shape:
                if not isinstance(dim, int) or dim < 0:
                    raise TypeError(f"shape {shape}")
                numel *= dim
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"tensor {key!r}: malformed entry ({exc})") from None
        if dtype not in _ITEM_BYTES:
            raise bad(f"tensor {key!r}: unsupported dtype {dtype}")
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop):
            raise bad(f"tensor {key!r}: bad data_offsets {entry['data_offsets']}")
        if stop - start != numel * _ITEM_BYTES[dtype]:
            raise bad(f"tensor {key!r}: {stop - start} bytes for shape {list(shape)} {dtype} ({numel * _ITEM_BYTES[dtype]} expected)")
        if stop > data_bytes:
            raise bad(f"tensor {key!r} ends at byte {stop} of a {data_bytes}-byte data section: the file is truncated")
        end = max(end, stop)
    if end != data_bytes:
        raise bad(f"data section is {data_bytes} bytes, its tensors cover {end}")
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
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


def write_safetensors_streaming(path: Path, infos: dict[str, TensorInfo], produce: Callable[[str], "torch.Tensor"]) -> int:
    """Write a safetensors file tensor by tensor: the header first (from ``infos``), then each
    tensor's bytes as ``produce(key)`` returns it, so only one tensor is in memory at a time."""
    import torch

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, info in infos.items():
        size = nbytes(info)
        header[key] = {"dtype": _SAFETENSORS_DTYPE[str(info.dtype).removeprefix("torch.")], "shape": list(info.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    tmp = path.with_name(f".{path.name}.tmp")
    with DirectFile(tmp) as out:  # past the page cache: the process never reads it back
        out.write(len(blob).to_bytes(8, "little") + blob)
        for key, info in infos.items():
            tensor = produce(key).contiguous()
            if tuple(tensor.shape) != info.shape or tensor.dtype != info.dtype:
                raise StageError(f"{key}: produced {tuple(tensor.shape)} {tensor.dtype}, planned {info.shape} {info.dtype}")
            flat = tensor.view(-1) if tensor.dim() else tensor.reshape(1)
            out.write(memoryview(flat.view(torch.uint8).numpy()))
            del tensor, flat
            crash_point("safetensors-tensor")
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    fsync_dir(path.parent)
    return offset


def nbytes(info: TensorInfo) -> int:
    import math

    import torch

    return math.prod(info.shape) * torch.empty((), dtype=info.dtype).element_size()


def iter_pairs(a: SafetensorsFolder, b: SafetensorsFolder, name_in_b: Callable[[str], str | None] = lambda k: k) -> Iterator[tuple[str, "torch.Tensor | None", "torch.Tensor | None"]]:
    mapped = {key: name_in_b(key) for key in a.index}
    matched = {m for m in mapped.values() if m is not None}
    for key in sorted(k for k, m in mapped.items() if m is not None):
        other = mapped[key]
        yield key, a.get(key), b.get(other) if other in b.index else None
    for key in sorted(set(b.index) - matched):
        yield key, None, b.get(key)


def compare_hf(a_dir: Path, b_dir: Path, name_in_b: Callable[[str], str | None] = lambda k: k, view_in_b: Callable[[str, Any], Any] = lambda k, t: t) -> list[str]:
    """Every difference between two folders of safetensors: missing keys, dtype, shape, bits.

    ``name_in_b`` maps a tensor name of ``a`` to its name in ``b`` (None: not expected there),
    for adapters that drop or rename on the way back (see :meth:`RenameAdapter.round_trip_name`);
    ``view_in_b`` maps a tensor of ``a`` to what ``b`` should hold, for adapters that change a
    layout on the way back (:meth:`FusedExpertsAdapter.round_trip_tensor`).
    """
    import torch

    problems = []
    a, b = SafetensorsFolder(a_dir), SafetensorsFolder(b_dir)
    for key, x, y in iter_pairs(a, b, name_in_b):
        if x is not None:
            x = view_in_b(key, x)
        if x is None or y is None:
            problems.append(f"{key}: only in {'the second' if x is None else 'the first'} checkpoint")
        elif x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{key}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
        elif not torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)):
            problems.append(f"{key}: values differ")
    return problems


__all__ = ["SAFE_INDEX", "SafetensorsFolder", "read_header", "safetensors_files", "write_safetensors_streaming", "nbytes", "compare_hf", "iter_pairs"]
