"""Processed samples on disk: safetensors shards plus a JSON index with each sample's length.

Written once by a preprocess/extract stage, read by offset by training (:class:`ShardFile`). No pickle: every
field of a sample is a tensor. The index keeps lengths so samplers can bucket or pack without
opening the shards.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hashlib

from mmcore.errors import StageError
from mmcore.framework.faults import crash_point
from mmcore.framework.files import atomic_write_json, fsync_file

if TYPE_CHECKING:
    import torch

INDEX = "index.json"
FILLER = "filler"  # the index key of a filler record: its media kind


class ShardWriter:
    """Buffers samples and writes ``shard-NNNNN.safetensors`` files of about ``max_shard_bytes``."""

    def __init__(self, out_dir: Path, *, max_shard_bytes: int = 256 << 20) -> None:
        self.out_dir = out_dir
        self.max_shard_bytes = max_shard_bytes
        self.samples: list[dict[str, Any]] = []
        self._buffer: dict[str, "torch.Tensor"] = {}
        self._buffer_bytes = 0
        self._shards = 0
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, tensors: dict[str, "torch.Tensor"], *, length: int, meta: dict[str, Any] | None = None) -> int:
        number = len(self.samples)
        for name, tensor in tensors.items():
            if "/" in name:
                raise ValueError(f"field name {name!r} may not contain '/'")
            self._buffer[f"{number}/{name}"] = tensor.contiguous()
            self._buffer_bytes += tensor.numel() * tensor.element_size()
        self.samples.append({"shard": self._shards, "fields": sorted(tensors), "length": int(length), **(meta or {})})
        if self._buffer_bytes >= self.max_shard_bytes:
            self._flush()
        return number

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self._buffer:
            return
        path = self.out_dir / f"shard-{self._shards:05d}.safetensors"
        save_file(self._buffer, str(path))
        fsync_file(path)
        self._buffer, self._buffer_bytes = {}, 0
        self._shards += 1
        crash_point("shard-write", self._shards)

    def add_filler(self, kind: str, tensors: dict[str, "torch.Tensor"]) -> int:
        """A filler sample of media ``kind`` (:mod:`mmcore.data.fillers`), after every sample: a
        record of the index that the dataset's length and splits leave out."""
        media = sorted(name for name in tensors if name not in ("input_ids", "labels"))
        return self.add(tensors, length=len(tensors["input_ids"]), meta={"filler": kind, "media": media})

    def close(self, **extra: Any) -> dict[str, Any]:
        """Write the last shard and then the index (the dataset exists once the index does)."""
        self._flush()
        real = sum(1 for s in self.samples if FILLER not in s)
        index = {"format": 1, "num_samples": real, "num_shards": self._shards, "samples": self.samples, **extra}
        atomic_write_json(self.out_dir / INDEX, index)
        return index


class ShardDataset:
    """Map-style dataset over a folder written by :class:`ShardWriter` (each tensor read by offset).

    ``indices`` are record numbers of the index; by default every sample, fillers left out
    (:meth:`fillers` has those, :meth:`with_fillers` every record in order).
    """

    def __init__(self, folder: Path, indices: list[int] | None = None) -> None:
        self.folder = folder
        try:
            self.index = json.loads((folder / INDEX).read_text())
        except (OSError, ValueError) as exc:
            raise StageError(f"{folder}: no readable {INDEX} ({exc}); rerun the stage that writes it") from None
        self.samples = self.index["samples"]
        self.indices = [n for n, s in enumerate(self.samples) if FILLER not in s] if indices is None else indices
        self._handles: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def length(self, i: int) -> int:
        return int(self.samples[self.indices[i]]["length"])

    def meta(self, i: int) -> dict[str, Any]:
        return self.samples[self.indices[i]]

    def __getitem__(self, i: int) -> dict[str, "torch.Tensor"]:
        number = self.indices[i]
        record = self.samples[number]
        shard = record["shard"]
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = ShardFile(self.folder / f"shard-{shard:05d}.safetensors")
        return {name: handle.tensor(f"{number}/{name}") for name in record["fields"]}

    def subset(self, indices: list[int]) -> "ShardDataset":
        return ShardDataset(self.folder, [self.indices[i] for i in indices])

    def fillers(self) -> "ShardDataset":
        """The filler records (``meta(i)["filler"]``: the media kind), in the order written."""
        return ShardDataset(self.folder, [n for n, s in enumerate(self.samples) if FILLER in s])

    def with_fillers(self) -> "ShardDataset":
        """Every record, samples then fillers: what a stage caching per record (extract) walks."""
        return ShardDataset(self.folder, list(range(len(self.samples))))

    def split(self, name: str) -> "ShardDataset":
        """The samples whose ``split`` meta is ``name`` (samples without one are ``train``)."""
        return self.subset([i for i in range(len(self)) if self.meta(i).get("split", "train") == name])


class ShardFile:
    """One safetensors file read by offset: its header parsed once, each tensor read with one
    ``pread`` into memory of its own (a few microseconds for a demo's sample: ``bench/data_path.py``).

    Not memory-mapped: a mapping's pages count as the process's resident memory once read, so an
    epoch over mapped shards showed as that much more RSS (``top``'s RES, ``wait4``'s peak, what
    a scheduler that kills on RSS reads) though the pages were clean page cache; read like this,
    the process holds only the batches in flight (BENCHMARKS.md, the peers rows). At most
    :data:`MAX_OPEN_SHARDS` files are open at once in a process (the least recently read closed
    first), so a dataset of thousands of shards stays under the open-file limit."""

    def __init__(self, path: Path) -> None:
        from mmcore.checkpoint.safetensors_files import _dtype, _read_raw_header

        header, start = _read_raw_header(path)
        self.entries = {key: (_dtype(e["dtype"]), tuple(e["shape"]), start + e["data_offsets"][0], start + e["data_offsets"][1]) for key, e in header.items()}
        self.path = path
        self._fd: int | None = None

    def tensor(self, key: str) -> "torch.Tensor":
        import torch

        try:
            dtype, shape, begin, end = self.entries[key]
        except KeyError:
            raise StageError(f"{self.path}: no tensor {key!r}; the shard does not match {INDEX} (rerun the stage that writes them)") from None
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        buffer = bytearray(end - begin)
        with _OPEN_LOCK:  # the prefetch thread and the loop read at once: no descriptor closed under a read
            if os.preadv(self._descriptor(), [buffer], begin) != end - begin:
                raise StageError(f"{self.path}: shorter than its header says (tensor {key!r}); rerun the stage that writes it")
        return torch.frombuffer(buffer, dtype=dtype).view(shape)

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            _OPEN[id(self)] = self
            while len(_OPEN) > MAX_OPEN_SHARDS:
                _OPEN.popitem(last=False)[1]._close()
        else:
            _OPEN.move_to_end(id(self))
        return self._fd

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


#: shard files open at once in a process (:class:`ShardFile`)
MAX_OPEN_SHARDS = 64
_OPEN: "OrderedDict[int, ShardFile]" = OrderedDict()  # open files, the most recently read last
_OPEN_LOCK = threading.Lock()


def split_key(file: str | Path, index: int) -> str:
    """What :func:`held_out` hashes for record ``index`` of a data file: its name, not its path,
    so the split is the same wherever the data lies (another machine, a moved folder)."""
    return f"{Path(file).name}:{index}"


def held_out(sample_key: str, fraction: float) -> bool:
    """A stable train/eval split: the same sample lands in the same split on every run and machine
    (``sample_key``: :func:`split_key`)."""
    digest = hashlib.sha256(sample_key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
