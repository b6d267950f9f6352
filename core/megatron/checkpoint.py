"""megatron-core's distributed checkpoint (``dist_checkpointing``) of a model: saved at one
tensor-parallel size, loaded at another (each tensor's global shape and its shard's offsets are
in the checkpoint, so it reshards at load; MindSpeed-MM's "TP at convert must match training"
does not apply).

A model here is a module whose megatron-core children (``GPTModel``) say how they are sharded
(``sharded_state_dict``) and whose other children (a transformers vision tower) are replicated
on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sharded_state(model: Any) -> dict[str, Any]:
    """The model's ``dist_checkpointing`` state: megatron-core children by their own sharding,
    every other child's tensors as replicated."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    state: dict[str, Any] = {}
    for name, child in model.named_children():
        if hasattr(child, "sharded_state_dict"):
            state.update(child.sharded_state_dict(prefix=f"{name}."))
        else:
            state.update(make_sharded_tensors_for_checkpoint(child.state_dict(), f"{name}."))
    return state


def save(model: Any, folder: Path) -> None:
    """Every rank calls it: each writes its shards once (replicas are written by one of them)."""
    from megatron.core import dist_checkpointing

    folder.mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(sharded_state(model), str(folder))


def load(model: Any, folder: Path) -> None:
    """Every rank calls it: fills ``model`` (built at any tensor-parallel size) from the
    checkpoint, every tensor the model has."""
    from megatron.core import dist_checkpointing

    model.load_state_dict(dist_checkpointing.load(sharded_state(model), str(folder)), strict=True)


__all__ = ["sharded_state", "save", "load"]
