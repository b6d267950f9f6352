"""Tensors of a torch distributed checkpoint (DCP) read by name: the index from its metadata,
whole tensors memory-mapped from their own files, the rest through ``dcp.load`` -- never
running code from the checkpoint (:mod:`mmcore.checkpoint.safe_dcp`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from mmcore.engines.state_dict import TensorInfo
from mmcore.errors import StageError

if TYPE_CHECKING:
    import torch

#: the prefix of the model's tensors in mmcore's DCP checkpoints (``"model." + fqn``)
MODEL_PREFIX = "model."


def dcp_index(ckpt_dir: Path, prefix: str = MODEL_PREFIX) -> dict[str, TensorInfo]:
    """Tensors under ``prefix`` in a DCP checkpoint, from its metadata (no tensor read)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from mmcore.checkpoint import safe_dcp

    try:
        metadata = safe_dcp.read_metadata(ckpt_dir)
    except OSError as exc:
        raise StageError(f"{ckpt_dir}: not a readable torch distributed checkpoint ({exc})") from None
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata):
            out[key[len(prefix) :]] = TensorInfo(tuple(meta.size), meta.properties.dtype)
    if not out:
        raise StageError(f"{ckpt_dir}: no model tensors (keys starting {prefix!r}) in the checkpoint")
    return out


def whole_tensor_files(ckpt_dir: Path, prefix: str = MODEL_PREFIX) -> dict[str, Path]:
    """Tensors under ``prefix`` that the checkpoint stores whole, alone in a file (as
    :func:`hf_to_dcp` writes them): key (without prefix) -> that file, a ``torch.save`` archive
    :func:`read_whole_tensor` maps into memory instead of reading through ``dcp.load``, which
    holds each tensor two or three times (a read buffer, the loaded tensor, its copy)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from mmcore.checkpoint import safe_dcp

    metadata = safe_dcp.read_metadata(ckpt_dir)
    stored = {}
    for index, info in metadata.storage_data.items():
        stored.setdefault(index.fqn, []).append(info)
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not key.startswith(prefix) or not isinstance(meta, TensorStorageMetadata) or len(meta.chunks) != 1 or len(stored.get(key, [])) != 1:
            continue
        chunk, info = meta.chunks[0], stored[key][0]
        path = ckpt_dir / info.relative_path
        whole = tuple(chunk.sizes) == tuple(meta.size) and not any(chunk.offsets)
        if whole and info.offset == 0 and not info.transform_descriptors and path.is_file() and path.stat().st_size == info.length:
            out[key[len(prefix) :]] = path
    return out


def read_whole_tensor(path: Path, info: TensorInfo) -> "torch.Tensor":
    """A tensor :func:`whole_tensor_files` found, memory-mapped (pages come from the page cache
    as the tensor is read, and go back to it after)."""
    import torch

    tensor = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != info.shape or tensor.dtype != info.dtype:
        raise StageError(f"{path}: not the {info.shape} {info.dtype} tensor the checkpoint's metadata records")
    return tensor


def load_dcp_tensors(ckpt_dir: Path, keys: Iterable[str], index: dict[str, TensorInfo], prefix: str = MODEL_PREFIX) -> dict[str, "torch.Tensor"]:
    import torch

    from mmcore.checkpoint import safe_dcp

    wanted = {prefix + k: torch.empty(index[k].shape, dtype=index[k].dtype) for k in keys}
    safe_dcp.load(wanted, ckpt_dir)
    return {k[len(prefix) :]: v for k, v in wanted.items()}


__all__ = ["MODEL_PREFIX", "dcp_index", "whole_tensor_files", "read_whole_tensor", "load_dcp_tensors"]
