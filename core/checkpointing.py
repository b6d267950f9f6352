"""Checkpoint IO of the train engine: the converted start, and resumable training checkpoints.

A training checkpoint (``checkpoints/step-N``) holds model and optimizer as DCP (reshardable
to any world size), the scheduler, the sampler position and every RNG state as JSON (no
pickle), written completely before ``checkpoints/latest`` points at it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmcore.io import atomic_write_json
from mmcore.sampler import EpochSampler

if TYPE_CHECKING:
    from torch import nn

# dcp.save/load without a process group is what we mean in one process: not worth a warning.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

CHECKPOINTS = "checkpoints"
LATEST = "latest"


def load_converted(model: "nn.Module", ckpt_dir: Path) -> None:
    """Load a checkpoint written by :func:`mmcore.convert.hf_to_dcp` into an unsharded model.

    Tied parameters (an output projection sharing the embedding, as hub checkpoints store it
    once) are read under their first name only.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    full = model.state_dict()
    first_name: dict[tuple[int, tuple[int, ...]], str] = {}
    alias: dict[str, str] = {}
    for key, tensor in full.items():
        identity = (tensor.data_ptr(), tuple(tensor.shape))
        if tensor.numel() and identity in first_name:
            alias[key] = first_name[identity]
        else:
            first_name.setdefault(identity, key)
    state = {f"model.{k}": v for k, v in full.items() if k not in alias}
    dcp.load(state, storage_reader=FileSystemReader(str(ckpt_dir)), no_dist=True)
    model.load_state_dict({k: state[f"model.{alias.get(k, k)}"] for k in full}, strict=True)


def _rng_state() -> dict[str, Any]:
    """Every RNG state as plain JSON (no pickle in checkpoints)."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def save_checkpoint(root: Path, step: int, model: Any, optimizer: Any, scheduler: Any, sampler: EpochSampler, world: Any, backend: Any) -> None:
    """Write ``root/step-N`` completely, then point ``root/latest`` at it (atomic rename)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target = root / f"step-{step:08d}"
    if world.is_local_main and target.exists():
        shutil.rmtree(target)
    if world.distributed:
        dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(target), no_dist=not world.distributed)
    extra = {"step": step, "scheduler": scheduler.state_dict(), "sampler_position": sampler.position}
    atomic_write_json(target / f"rng-rank{world.rank:05d}.json", _rng_state())
    if world.is_local_main:
        atomic_write_json(target / "trainer_state.json", extra)
    if world.distributed:
        dist.barrier()
    if world.is_local_main:
        link = root / LATEST
        tmp = root / f".{LATEST}.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target.name)
        os.replace(tmp, link)
        for old in sorted(root.glob("step-*"))[:-2]:  # keep the last two
            shutil.rmtree(old, ignore_errors=True)
    if world.distributed:
        dist.barrier()


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any, sampler: EpochSampler, world: Any, backend: Any) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    path = path.resolve()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # get_state_dict gives a fresh optimizer state for every trainable parameter, but AdamW keeps
    # none for a parameter that has had no gradient yet (a tower no batch used so far), so the
    # checkpoint has none either. Leave those out: they start lazily, as in the unbroken run.
    saved = set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    for fqn in [f for f in optim_sd.get("state", {}) if not any(k.startswith(f"optim.state.{f}.") for k in saved)]:
        del optim_sd["state"][fqn]
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), no_dist=not world.distributed)
    # strict=False lets those parameters go without state; dcp.load above already required every
    # model tensor and every optimizer state the checkpoint should hold.
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=StateDictOptions(strict=False))
    extra = json.loads((path / "trainer_state.json").read_text())
    scheduler.load_state_dict(extra["scheduler"])
    sampler.position = extra["sampler_position"]
    rng_file = path / f"rng-rank{world.rank:05d}.json"
    if rng_file.exists():  # absent when resuming on more ranks than saved: those start fresh streams
        _set_rng_state(json.loads(rng_file.read_text()))
    return int(extra["step"])


__all__ = ["CHECKPOINTS", "LATEST", "load_converted", "save_checkpoint", "load_checkpoint", "seed_everything"]
