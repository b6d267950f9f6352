"""Torch distributed checkpoint (DCP) files written and read without importing torch.

A conversion that only renames tensors (a :class:`~mmcore.engines.state_dict.RenameAdapter`)
moves bytes: importing torch took more than half of a whole-process conversion (~3 s of cp's
3.4 s for a 4 GiB checkpoint, ``bench/convert_speed.py``). This module writes what torch's
``FileSystemWriter`` writes for convert's layout (each tensor alone in ``__0_<i>.distcp``), and
reads tensors stored so, with the standard library alone:

* a ``.distcp`` file is a ``torch.save`` archive: an uncompressed zip whose records are
  ``data.pkl`` (a protocol-2 pickle rebuilding the tensor from storage ``0``), the format
  records, ``data/0`` (the tensor's bytes, 64-byte aligned) and a serialization id; CRC32s
  are zero, as convert's torch path writes them (``save.compute_crc32`` off);
* ``.metadata`` is a protocol-4 pickle of DCP's metadata classes, written here by reference
  (module and name) and read by mapping those names to plain records: nothing is imported or
  run from the file (what :mod:`mmcore.checkpoint.safe_dcp` guards on the torch path).

Checked against torch: what this writes loads through ``dcp.load`` bit for bit, its archives
equal ``torch.save``'s but for the serialization id, and it reads what torch's writer wrote
(``tests/test_dcp_files.py``).
"""

from __future__ import annotations

import io
import os
import pickle
import secrets
import struct
from pathlib import Path
from typing import Any, BinaryIO

from mmcore.errors import StageError

#: safetensors dtype -> (torch dtype name, typed storage class, bytes per element)
DTYPES = {
    "F64": ("float64", "DoubleStorage", 8),
    "F32": ("float32", "FloatStorage", 4),
    "F16": ("float16", "HalfStorage", 2),
    "BF16": ("bfloat16", "BFloat16Storage", 2),
    "I64": ("int64", "LongStorage", 8),
    "I32": ("int32", "IntStorage", 4),
    "I16": ("int16", "ShortStorage", 2),
    "I8": ("int8", "CharStorage", 1),
    "U8": ("uint8", "ByteStorage", 1),
    "BOOL": ("bool", "BoolStorage", 1),
}
BY_TORCH_NAME = {torch_name: code for code, (torch_name, _, _) in DTYPES.items()}
ALIGN = 64  # torch.save's storage alignment
#: a record or archive this large would need zip64 fields; such tensors take the torch path
MAX_RECORD = 0xFFFFFFFF - (1 << 20)
META = "torch.distributed.checkpoint.metadata"


# --------------------------------------------------------------------------- pickling by reference


class Ref:
    """A module-level name of another library (a class, a function, a dtype), pickled as a
    reference to it without importing it."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class Obj:
    """An instance of ``cls``: created without arguments, then given ``state`` (what pickle
    does for a dataclass)."""

    def __init__(self, cls: Ref, state: Any) -> None:
        self.cls, self.state = cls, state


class Call:
    """``func(*args)``, pickled as such (``torch.Size((2, 3))``, an enum member)."""

    def __init__(self, func: Ref, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args


class Storage:
    """A tensor's storage in a ``torch.save`` archive: a persistent id, its bytes a record."""

    def __init__(self, kind: Ref, key: str, numel: int) -> None:
        self.pid = ("storage", kind, key, "cpu", numel)


class _Pickler(pickle._Pickler):  # the Python pickler: its dispatch table takes our types
    dispatch = dict(pickle._Pickler.dispatch)

    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, Storage) else None

    def _save_ref(self, obj: Ref) -> None:
        if self.proto >= 4:
            self.save(obj.module)
            self.save(obj.name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    def _save_obj(self, obj: Obj) -> None:
        self.save(obj.cls)
        self.save(())
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        self.save(obj.state)
        self.write(pickle.BUILD)

    def _save_call(self, obj: Call) -> None:
        self.save(obj.func)
        self.save(obj.args)
        self.write(pickle.REDUCE)
        self.memoize(obj)

    dispatch[Ref] = _save_ref
    dispatch[Obj] = _save_obj
    dispatch[Call] = _save_call


def dumps(obj: Any, protocol: int) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol).dump(obj)
    return out.getvalue()


# --------------------------------------------------------------------------- torch.save archives


def contiguous(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(elements, row-major strides) of a contiguous tensor of ``shape``."""
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return step, tuple(reversed(strides))


def tensor_pickle(code: str, shape: tuple[int, ...]) -> bytes:
    """``data.pkl`` of a ``torch.save``'d contiguous tensor of ``shape`` (safetensors dtype
    ``code``) whose storage is record ``0``: the bytes torch's pickler writes."""
    numel, stride = contiguous(shape)
    storage = Storage(Ref("torch", DTYPES[code][1]), "0", numel)
    rebuild = Call(Ref("torch._utils", "_rebuild_tensor_v2"), (storage, 0, tuple(shape), stride, False, Call(Ref("collections", "OrderedDict"), ())))
    return dumps(rebuild, 2)


def _flags(size: int) -> int:
    return 0x0800 if size == 0 else 0x0808  # UTF-8 names; sizes in a descriptor after the data (none after an empty record)


def _local_header(name: bytes, cursor: int, size: int) -> bytes:
    start = cursor + 30 + len(name) + 4
    padding = -start % ALIGN
    extra = b"FB" + struct.pack("<H", padding) + b"Z" * padding
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, _flags(size), 0, 0, 0, 0, 0, 0, len(name), len(extra)) + name + extra


class ArchiveWriter:
    """Writes one ``torch.save`` archive to ``out`` (at its current position), record by record."""

    def __init__(self, out: BinaryIO, prefix: str = "archive") -> None:
        self.out, self.prefix, self.base = out, prefix, out.tell()
        self.records: list[tuple[bytes, int, int]] = []  # name, local header offset, size

    def begin(self, name: str, size: int) -> int:
        """Start record ``name`` of ``size`` bytes; returns the file offset they go to."""
        encoded = f"{self.prefix}/{name}".encode()
        header = _local_header(encoded, self.out.tell() - self.base, size)
        self.records.append((encoded, self.out.tell() - self.base, 0))
        self.out.write(header)
        return self.out.tell()

    def end(self, size: int) -> None:
        name, offset, _ = self.records[-1]
        self.records[-1] = (name, offset, size)
        if size:
            self.out.write(struct.pack("<IIII", 0x08074B50, 0, size, size))

    def record(self, name: str, data: bytes) -> None:
        self.begin(name, len(data))
        self.out.write(data)
        self.end(len(data))

    def close(self) -> int:
        """The central directory and end records; returns the archive's length."""
        self.record("version", b"3\n")
        self.record(".data/serialization_id", str(secrets.randbelow(10**40)).zfill(40).encode())
        start = self.out.tell() - self.base
        for name, offset, size in self.records:
            self.out.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, _flags(size), 0, 0, 0, 0, size, size, len(name), 0, 0, 0, 0, 0, offset) + name)
        end = self.out.tell() - self.base
        n = len(self.records)
        self.out.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x002D, 0, 0, n, n, end - start, start))
        self.out.write(struct.pack("<IIQI", 0x07064B50, 0, end, 1))
        self.out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, end - start, start, 0))
        return self.out.tell() - self.base


def copy_bytes(src: BinaryIO, src_offset: int, dst: BinaryIO, count: int) -> None:
    """``count`` bytes of ``src`` from ``src_offset`` appended to ``dst`` (in the kernel where it
    can); ``src``'s position is not used, so threads may copy from one handle."""
    dst.flush()
    done, out_offset = 0, dst.tell()
    try:
        while done < count:
            n = os.copy_file_range(src.fileno(), dst.fileno(), count - done, src_offset + done, out_offset + done)
            if n <= 0:
                raise OSError("copy_file_range copied nothing")
            done += n
    except (OSError, AttributeError):
        dst.seek(out_offset + done)
        while done < count:  # pread: ``src`` may be shared by threads copying other ranges of it
            chunk = os.pread(src.fileno(), min(64 << 20, count - done), src_offset + done)
            if not chunk:
                raise StageError(f"{src.name}: truncated: {count - done} bytes missing")
            dst.write(chunk)
            done += len(chunk)
    dst.seek(out_offset + count)


def write_tensor_file(path: Path, code: str, shape: tuple[int, ...], src: BinaryIO, offset: int, nbytes: int) -> int:
    """A ``.distcp`` file holding one tensor as ``torch.save`` writes it, its bytes copied from
    ``src`` at ``offset``; returns the file's length."""
    with open(path, "wb") as out:
        archive = ArchiveWriter(out)
        archive.record("data.pkl", tensor_pickle(code, shape))
        archive.record(".format_version", b"1")
        archive.record(".storage_alignment", str(ALIGN).encode())
        archive.record("byteorder", b"little")
        archive.begin("data/0", nbytes)
        copy_bytes(src, offset, out, nbytes)
        archive.end(nbytes)
        return archive.close()


# --------------------------------------------------------------------------- .metadata


def _size(dims: tuple[int, ...]) -> Call:
    return Call(Ref("torch", "Size"), (tuple(dims),))


def metadata_pickle(tensors: dict[str, tuple[str, tuple[int, ...], str, int]], checkpoint_id: str) -> bytes:
    """``.metadata`` for whole tensors, each alone in a file: ``{fqn: (safetensors dtype, shape,
    file name, file length)}``; what ``FileSystemWriter`` pickles for such a checkpoint."""
    layout = Call(Ref("torch.serialization", "_get_layout"), ("torch.strided",))
    contiguous = Call(Ref(META, "_MEM_FORMAT_ENCODING"), (0,))
    state, planner, storage = {}, {}, {}
    for fqn, (code, shape, file, length) in tensors.items():
        properties = Obj(Ref(META, "TensorProperties"), (Ref("torch", DTYPES[code][0]), layout, False, contiguous, False))
        chunk = Obj(Ref(META, "ChunkStorageMetadata"), {"offsets": _size((0,) * len(shape)), "sizes": _size(shape)})
        state[fqn] = Obj(Ref(META, "TensorStorageMetadata"), {"properties": properties, "size": _size(shape), "chunks": [chunk]})
        planner[fqn] = (fqn,)
        index = Obj(Ref(META, "MetadataIndex"), {"fqn": fqn, "index": 0, "offset": _size((0,) * len(shape))})
        storage[index] = Obj(Ref("torch.distributed.checkpoint.filesystem", "_StorageInfo"), {"relative_path": file, "offset": 0, "length": length})
    meta = {"checkpoint_id": checkpoint_id, "save_id": _uuid(), "load_id": None, "modules": []}
    top = {"state_dict_metadata": state, "planner_data": planner, "storage_data": storage, "storage_meta": Obj(Ref(META, "StorageMeta"), meta), "version": "1.0.0"}
    return dumps(Obj(Ref(META, "Metadata"), top), 4)


def _uuid() -> str:
    import uuid

    return str(uuid.uuid4())


class Record:
    """A DCP metadata object read back: its pickled state as attributes (or ``state``)."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _Reader(pickle.Unpickler):
    """Resolves the names DCP's metadata and ``torch.save``'s ``data.pkl`` use to plain records;
    any other name is refused (nothing is imported or called from a file)."""

    def __init__(self, stream: Any, path: Path) -> None:
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if module in (META, "torch.distributed.checkpoint.filesystem") and not name.startswith("__"):
            return type(name, (Record,), {}) if name != "_MEM_FORMAT_ENCODING" else int
        if module == "torch" and name == "Size":
            return tuple
        if module == "torch" and (name in BY_TORCH_NAME or name.endswith("Storage")):
            return name  # a dtype or storage kind, by name
        if (module, name) in (("torch.serialization", "_get_layout"), ("torch._utils", "_get_layout")):
            return str
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: {"storage": storage, "offset": offset, "size": tuple(size), "stride": tuple(stride)}
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if (module, name) in (("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "Path")):
            return lambda *parts: os.path.join(*parts)  # pickled as its parts
        raise StageError(f"{self.path}: refused to read: it references {module}.{name}, which no DCP file needs (a tampered or foreign file)")

    def persistent_load(self, pid: Any) -> Any:
        return pid


def read_metadata(ckpt_dir: Path) -> Any:
    path = ckpt_dir / ".metadata"
    try:
        with open(path, "rb") as handle:
            return _Reader(handle, path).load()
    except FileNotFoundError:
        raise StageError(f"{path}: missing: the checkpoint in {ckpt_dir} was not completely written") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise StageError(f"{path}: not a readable DCP metadata file ({type(exc).__name__}: {exc})") from None


def whole_tensors(ckpt_dir: Path, prefix: str) -> dict[str, tuple[str, tuple[int, ...], Path, int, int]] | None:
    """Tensors under ``prefix`` as ``{key without prefix: (safetensors dtype, shape, file, offset
    of their bytes, byte count)}`` where every one is stored whole and contiguous in an archive of
    its own (convert's layout, or a one-process checkpoint's); None where any is not (sharded,
    transformed, another dtype): the torch path reads those."""
    metadata = read_metadata(ckpt_dir)
    try:
        return _whole_tensors(ckpt_dir, metadata, prefix)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError, struct.error, pickle.UnpicklingError, EOFError, UnicodeDecodeError, OSError):
        return None  # a layout this reader does not know: the torch path reads it (and says what is wrong)


def _whole_tensors(ckpt_dir: Path, metadata: Any, prefix: str) -> dict[str, tuple[str, tuple[int, ...], Path, int, int]] | None:
    stored: dict[str, list[Any]] = {}
    for index, info in metadata.storage_data.items():
        stored.setdefault(index.fqn, []).append(info)
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not key.startswith(prefix) or not hasattr(meta, "chunks"):
            continue
        dtype, shape = meta.properties.state[0], tuple(meta.size)
        infos = stored.get(key, [])
        if dtype not in BY_TORCH_NAME or len(meta.chunks) != 1 or len(infos) != 1 or getattr(infos[0], "transform_descriptors", None):
            return None
        if tuple(meta.chunks[0].sizes) != shape or any(meta.chunks[0].offsets):
            return None
        info = infos[0]
        located = _tensor_bytes(ckpt_dir / info.relative_path, info.offset, info.length, BY_TORCH_NAME[dtype], shape)
        if located is None:
            return None
        out[key[len(prefix) :]] = (BY_TORCH_NAME[dtype], shape, ckpt_dir / info.relative_path, *located)
    return out


def _tensor_bytes(path: Path, base: int, length: int, code: str, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(file offset, byte count) of the tensor in the ``torch.save`` archive at ``base`` of
    ``path``, where it is a contiguous ``shape`` tensor of ``code``; None otherwise."""
    with open(path, "rb") as handle:
        handle.seek(base + length - 22)
        tail = handle.read(22)
        sig, _, _, _, n, _, cd_offset, _ = struct.unpack("<IHHHHIIH", tail)
        if sig != 0x06054B50 or cd_offset == 0xFFFFFFFF:
            return None
        handle.seek(base + cd_offset)
        records = {}
        for _ in range(n):
            fixed = handle.read(46)
            (sig, *fields) = struct.unpack("<IHHHHHHIIIHHHHHII", fixed)
            if sig != 0x02014B50 or fields[3] != 0:  # compressed: not torch.save's
                return None
            size, name_len, extra_len, comment_len, offset = fields[8], fields[9], fields[10], fields[11], fields[15]
            name = handle.read(name_len).decode()
            handle.seek(extra_len + comment_len, os.SEEK_CUR)
            records[name.split("/", 1)[1] if "/" in name else name] = (offset, size)

        def data_of(record: str) -> tuple[int, int]:
            offset, size = records[record]
            handle.seek(base + offset + 26)
            name_len, extra_len = struct.unpack("<HH", handle.read(4))
            return base + offset + 30 + name_len + extra_len, size

        if "data.pkl" not in records:
            return None
        start, size = data_of("data.pkl")
        handle.seek(start)
        rebuilt = _Reader(io.BytesIO(handle.read(size)), path).load()
        storage = rebuilt["storage"]
        item = DTYPES[code][2]
        numel, stride = contiguous(shape)
        if storage[1] != DTYPES[code][1] or rebuilt["size"] != shape or (numel > 1 and rebuilt["stride"] != stride):
            return None
        start, size = data_of(f"data/{storage[2]}")
        if (rebuilt["offset"] + numel) * item > size:
            return None
        return start + rebuilt["offset"] * item, numel * item
