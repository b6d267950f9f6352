"""Reading torch distributed checkpoints (DCP) without letting them run code.

torch's ``FileSystemReader`` unpickles a checkpoint's ``.metadata`` with an unrestricted
unpickler and its planner reads non-tensor values (optimizer hyper-parameters) without
torch's weights-only guard: a planted file in a run directory or a shared checkpoint would
execute code when loaded. Every DCP read in mmcore goes through :func:`reader` and
:func:`planner` instead: the metadata unpickler resolves only the classes DCP's own metadata is
made of (an allow-list), and non-tensor values load with ``weights_only=True``. Anything else
is refused with a one-line :class:`UnsafeCheckpoint` naming the file and the global it asked for.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from mmcore.errors import StageError

#: module -> names a DCP ``.metadata`` may reference (None: any class defined in that module).
_ALLOWED: dict[str, frozenset[str] | None] = {
    "torch.distributed.checkpoint.metadata": None,
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.distributed.checkpoint.planner": frozenset({"LoadItemType", "WriteItemType"}),
    "torch._utils": frozenset({"_get_layout"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset", "slice", "complex"}),
}


class UnsafeCheckpoint(StageError):
    """A checkpoint file that asks to run or import something no checkpoint needs."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream: Any, path: str) -> None:
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        import torch

        allowed = _ALLOWED.get(module, frozenset())
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            allowed = frozenset({name})
        if allowed is None or name in allowed:
            value = super().find_class(module, name)
            if allowed is not None or isinstance(value, type):
                return value
        raise UnsafeCheckpoint(
            f"{self.path}: refused to load: it references {module}.{name}, which no DCP checkpoint metadata needs (a tampered or foreign file)",
            hint="checkpoints run code when unpickled; import weights from elsewhere as safetensors (mmcore convert)",
        )


def load_metadata(path: str | Path, stream: Any) -> Any:
    try:
        return _MetadataUnpickler(stream, str(path)).load()
    except UnsafeCheckpoint:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError) as exc:
        raise StageError(f"{path}: not a readable DCP metadata file ({type(exc).__name__}: {exc}); the checkpoint is truncated or corrupt") from None


def reader(path: str | Path) -> Any:
    """A ``FileSystemReader`` for ``path`` whose metadata unpickler is the allow-list above, and
    which maps a tensor stored alone in its file (as convert writes them, and each piece of a
    megatron run's trained weights) instead of reading it: only the pages of the part a rank
    asks for are read, where torch's reader decodes each stored tensor whole first."""
    import dataclasses

    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    class SafeReader(FileSystemReader):
        def read_data(self, plan: Any, planner: Any) -> Any:
            sizes: dict[Path, int] = {}
            rest = []
            for request in plan.items:
                stored = self.storage_data[request.storage_index]
                file = Path(str(self.path)) / stored.relative_path
                if file not in sizes:
                    sizes[file] = file.stat().st_size if file.is_file() else -1
                if request.type != LoadItemType.TENSOR or stored.offset or stored.transform_descriptors or sizes[file] != stored.length:
                    rest.append(request)
                    continue
                tensor = narrow_tensor_by_index(torch.load(file, map_location="cpu", weights_only=True, mmap=True), request.storage_offsets, request.lengths)
                target = planner.resolve_tensor(request).detach()
                if target.size() != tensor.size():
                    raise StageError(f"{file}: holds {tuple(tensor.size())} where the checkpoint's metadata records {tuple(target.size())}; the checkpoint is corrupt")
                target.copy_(tensor)
                planner.commit_tensor(request, target)
            return super().read_data(dataclasses.replace(plan, items=rest), planner)

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            meta_path = self._get_metadata_path(kwargs.get("rank"))
            try:
                with self.fs.create_stream(meta_path, "rb") as handle:
                    metadata = load_metadata(meta_path, io.BytesIO(handle.read()))
            except FileNotFoundError:
                raise StageError(f"{meta_path}: missing: the checkpoint in {self.path} was not completely written") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def planner() -> Any:
    """DCP's default load planner, reading non-tensor values with ``weights_only=True``."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeLoadPlanner()


def load(state: dict[str, Any], path: str | Path, *, distributed: bool = False) -> None:
    """``dcp.load(state)`` from ``path`` with the safe reader and planner."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    # a refused or absent .metadata is its one line here: DCP would fall back to per-rank files,
    # logging a traceback for each, then raise an exception that says neither
    read_metadata(path)
    try:
        dcp.load(state, storage_reader=reader(path), planner=planner(), no_dist=not distributed)
    except CheckpointException as exc:  # a BaseException: every `except Exception` would miss it
        failure = next(iter(exc.failures.values()), None)
        cause = getattr(failure, "exception", failure)
        if isinstance(cause, StageError):
            raise cause from None
        raise StageError(f"{path}: the checkpoint could not be read: {type(cause).__name__}: {' '.join(str(cause).split())}") from None


def read_metadata(path: str | Path) -> Any:
    return reader(path).read_metadata()


__all__ = ["UnsafeCheckpoint", "reader", "planner", "load", "read_metadata", "load_metadata"]
