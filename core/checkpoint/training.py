"""Checkpoint IO of the train engine: the converted start, and resumable training checkpoints.

A training checkpoint (``checkpoints/step-N``) holds model and optimizer as DCP (reshardable
to any world size), the scheduler, the sampler position and every RNG state as JSON (no
pickle), written completely under ``step-N.incomplete`` and renamed into place before
``checkpoints/latest`` points at it; resuming takes the newest complete checkpoint. Reading
goes through :mod:`mmcore.checkpoint.safe_dcp`, so a planted checkpoint file cannot run code.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mmcore.framework.faults import crash_point
from mmcore.framework.files import atomic_write_json, fsync_dir
from mmcore.train.sampler import EpochSampler

if TYPE_CHECKING:
    from torch import nn

# dcp.save/load without a process group is what we mean in one process: not worth a warning.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STEP_PREFIX = "step-"
INCOMPLETE = ".incomplete"
TRAINER_STATE = "trainer_state.json"


def load_converted(model: "nn.Module", ckpt_dir: Path) -> None:
    """Load a checkpoint written by :func:`mmcore.engines.convert.hf_to_dcp`, or a training checkpoint,
    into an unsharded model.

    Tied parameters (an output projection sharing the embedding, as hub checkpoints store it
    once) are read under their first name only (:func:`mmcore.checkpoint.sharded_load.load_weights`).
    A LoRA training checkpoint (``lora.json``) holds only what trained: the model gets its base
    weights from the base checkpoint the plan names, then the adapters (in place, peft's
    layers), then the trained weights.
    """
    from mmcore.train.lora import LoraPlan, load_trained
    from mmcore.checkpoint.sharded_load import load_weights

    plan = LoraPlan.read(ckpt_dir)
    if plan is not None:
        load_trained(model, Path(ckpt_dir), plan)
        return
    load_weights(model, ckpt_dir, distributed=False)


def _rng_state() -> dict[str, Any]:
    """Every RNG state as plain JSON (no pickle in checkpoints)."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # dropout masks drawn on the GPU
        state["cuda"] = torch.cuda.get_rng_state().tolist()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith(STEP_PREFIX) or not name[len(STEP_PREFIX) :].isdigit():
        return None
    return int(name[len(STEP_PREFIX) :])


def is_complete(path: Path) -> bool:
    """A checkpoint directory every rank finished writing: ``trainer_state.json`` is written
    last, after DCP's ``.metadata`` and every rank's RNG state."""
    return path.is_dir() and (path / ".metadata").is_file() and (path / TRAINER_STATE).is_file()


def newest_complete(root: Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root`` (``latest`` is only a pointer:
    a kill between finishing a checkpoint and moving the pointer must not lose it)."""
    steps = sorted((s, d) for d in root.glob(f"{STEP_PREFIX}*") if (s := _step_of(d)) is not None and is_complete(d))
    return steps[-1][1] if steps else None


def _point_latest(root: Path, target: Path) -> None:
    link = root / LATEST
    tmp = root / f".{LATEST}.{socket.gethostname()}.{os.getpid()}.tmp"  # nodes sharing the directory never collide
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, link)
    fsync_dir(root)


def save_checkpoint(
    root: Path,
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    sampler: EpochSampler,
    world: Any,
    backend: Any,
    *,
    loss: float | None = None,
    keep: set[str] | None = None,
    files: dict[str, Any] | None = None,
    ema: dict[str, Any] | None = None,
) -> None:
    """Write ``root/step-N`` (model and optimizer as DCP), then point ``root/latest`` at it
    (:func:`commit_checkpoint` says how, and what is kept).

    ``keep`` limits the model state saved to these keys (LoRA: adapters, not the frozen base);
    ``files`` are JSON files written into the checkpoint (LoRA: its plan, ``lora.json``);
    ``ema`` the moving average of the trained weights (:mod:`mmcore.train.ema`), saved as ``ema.<name>``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def write(partial: Path) -> None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        if keep is not None:
            model_sd = {k: v for k, v in model_sd.items() if k in keep}
        state = {"model": model_sd, "optim": optim_sd, **({"ema": ema} if ema is not None else {})}
        dcp.save(state, checkpoint_id=str(partial), no_dist=not world.distributed)

    trainer_state = {"step": step, "loss": loss, "scheduler": scheduler.state_dict(), "sampler_position": sampler.position}
    commit_checkpoint(root, step, world, write, trainer_state, files)


def commit_checkpoint(
    root: Path, step: int, world: Any, write: Callable[[Path], None], trainer_state: dict[str, Any], files: dict[str, Any] | None = None, more_rng: Callable[[], dict[str, Any]] | None = None
) -> None:
    """Every rank calls it: ``write(folder)`` (each rank its part, ending with DCP's
    ``.metadata``), then every rank's RNG state, ``files`` and ``trainer_state`` (the step, the
    scheduler, the data position), into ``root/step-N``; then ``root/latest`` points at it.

    The checkpoint is written under ``step-N.incomplete`` and renamed into place only once
    every rank has finished, so a complete checkpoint is never deleted or overwritten for a
    new one: if a complete ``step-N`` exists already (a run resumed at its last step, or
    killed after the rename and before ``latest`` moved), it is the same state and is kept.
    Only the two newest complete checkpoints are kept. ``more_rng``: random states a backend
    keeps beside torch's (JSON), saved with this rank's (:func:`saved_rng` reads them back).
    """
    import torch.distributed as dist

    final = root / f"{STEP_PREFIX}{step:08d}"
    partial = root / f"{final.name}{INCOMPLETE}"
    if world.distributed:
        dist.barrier()  # nobody is still reading: safe to look at the directory
    if not is_complete(final):
        # Every node's local rank 0 manages the directory: on a shared file system they do the
        # same thing (each step tolerates the other having done it), on node-local disks each
        # its own part.
        if world.is_local_main:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)  # a directory of that name that never completed
        if world.distributed:
            dist.barrier()
        try:
            write(partial)
        except BaseException:
            if world.is_local_main:  # the space back: a full disk must still take the error log and the session record
                shutil.rmtree(partial, ignore_errors=True)
            raise
        crash_point("checkpoint-write", step)
        atomic_write_json(partial / f"rng-rank{world.rank:05d}.json", {**_rng_state(), **(more_rng() if more_rng else {})})
        if world.distributed:
            dist.barrier()
        if world.is_local_main:
            for name, content in (files or {}).items():
                atomic_write_json(partial / name, content)
            atomic_write_json(partial / TRAINER_STATE, trainer_state)  # last: the checkpoint is complete
        if world.distributed:
            dist.barrier()
        if world.is_local_main:
            try:
                os.replace(partial, final)
            except FileNotFoundError:
                pass  # another node on the same file system moved it already
            fsync_dir(root)
        if world.distributed:
            dist.barrier()
    if world.is_local_main:
        _point_latest(root, final)
        crash_point("checkpoint-link", step)
        complete = sorted((s, d) for d in root.glob(f"{STEP_PREFIX}*") if (s := _step_of(d)) is not None and is_complete(d))
        for _, old in complete[:-2]:  # keep the last two
            shutil.rmtree(old, ignore_errors=True)
        for stray in root.glob(f"{STEP_PREFIX}*{INCOMPLETE}"):
            shutil.rmtree(stray, ignore_errors=True)
    if world.distributed:
        dist.barrier()


def saved_rng(path: Path, rank: int) -> dict[str, Any] | None:
    """Rank ``rank``'s saved random states in checkpoint ``path`` (with what
    :func:`commit_checkpoint`'s ``more_rng`` added), or None when it saved none."""
    rng_file = path / f"rng-rank{rank:05d}.json"
    return json.loads(rng_file.read_text()) if rng_file.exists() else None


def restore_rng(path: Path, world: Any, rank: int | None = None) -> bool:
    """This rank's RNG state from checkpoint ``path`` (that of the saved rank ``rank`` if given);
    False, the state untouched, when it has none (resuming on more ranks than saved: those
    start fresh streams)."""
    state = saved_rng(path, world.rank if rank is None else rank)
    if state is None:
        return False
    _set_rng_state(state)
    return True


def load_checkpoint(
    path: Path, model: Any, optimizer: Any, scheduler: Any, sampler: EpochSampler, world: Any, backend: Any, *, keep: set[str] | None = None, ema: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Restore everything :func:`save_checkpoint` wrote (with the same ``keep``; ``ema`` is
    filled in place); returns its trainer state (``step``, ``loss`` of that step, ...)."""
    from mmcore.errors import StageError
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    from mmcore.checkpoint import safe_dcp

    path = path.resolve()
    extra = json.loads((path / TRAINER_STATE).read_text())
    if extra.get("backend", "fsdp2") != "fsdp2":
        raise StageError(f"{path}: saved by parallel.backend: {extra['backend']}; resume with that backend (its checkpoints hold another layout)")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    if keep is not None:
        model_sd = {k: v for k, v in model_sd.items() if k in keep}
    # get_state_dict gives a fresh optimizer state for every trainable parameter, but AdamW keeps
    # none for a parameter that has had no gradient yet (a tower no batch used so far), so the
    # checkpoint has none either. Leave those out: they start lazily, as in the unbroken run.
    saved = set(safe_dcp.read_metadata(path).state_dict_metadata)
    for fqn in [f for f in optim_sd.get("state", {}) if not any(k.startswith(f"optim.state.{f}.") for k in saved)]:
        del optim_sd["state"][fqn]
    state = {"model": model_sd, "optim": optim_sd}
    if ema is not None:
        if not any(k.startswith("ema.") for k in saved):
            raise StageError(f"{path}: saved without a moving average of the weights (training.ema was 0); resume with training.ema=0 or start a new run")
        state["ema"] = ema
    safe_dcp.load(state, path, distributed=world.distributed)
    # strict=False lets those parameters go without state; dcp.load above already required every
    # model tensor and every optimizer state the checkpoint should hold.
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=StateDictOptions(strict=False))
    scheduler.load_state_dict(extra["scheduler"])
    sampler.position = extra["sampler_position"]
    restore_rng(path, world)
    return extra


def save_average(folder: Path, model: Any, average: dict[str, Any], world: Any, *, keep: set[str] | None = None, files: dict[str, Any] | None = None) -> None:
    """Write the model's weights with ``average``'s in place of the trained ones as a model
    checkpoint (``model.<name>``, what :func:`load_converted` and export read) at ``folder``,
    replacing what was there only once it is complete. ``keep`` and ``files`` as in
    :func:`save_checkpoint` (LoRA: the averaged adapters and the plan)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    partial = folder.with_name(folder.name + INCOMPLETE)
    if world.distributed:
        dist.barrier()
    if world.is_local_main:
        shutil.rmtree(partial, ignore_errors=True)
    if world.distributed:
        dist.barrier()
    first: dict[int, str] = {}
    canonical = {}  # a tied parameter's every name -> the name the average has it under
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical[name] = first.setdefault(id(param), name)
    state = get_model_state_dict(model)
    if keep is not None:
        state = {k: v for k, v in state.items() if k in keep}
    for key in state:
        if canonical.get(key, key) in average:
            state[key] = average[canonical.get(key, key)]
    if not set(average) <= {canonical.get(k, k) for k in state}:
        raise RuntimeError(f"the moving average holds weights the model's state does not: {sorted(set(average) - set(state))[:3]}")
    dcp.save({"model": state}, checkpoint_id=str(partial), no_dist=not world.distributed)
    if world.distributed:
        dist.barrier()
    if world.is_local_main:
        for name, content in (files or {}).items():
            atomic_write_json(partial / name, content)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(partial, folder)
        except FileNotFoundError:
            pass  # another node on the same file system moved it already
        fsync_dir(folder.parent)
    if world.distributed:
        dist.barrier()


__all__ = [
    "CHECKPOINTS",
    "LATEST",
    "TRAINER_STATE",
    "commit_checkpoint",
    "restore_rng",
    "saved_rng",
    "is_complete",
    "newest_complete",
    "load_converted",
    "save_checkpoint",
    "load_checkpoint",
    "save_average",
    "seed_everything",
]
