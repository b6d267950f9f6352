"""The train engine: one loop for every pack — setup, step, checkpoint, log.

A pack hands :func:`run_training` a :class:`TrainRecipe` with only what is model-specific:
build the model, its dataset and collate function, batch -> summed loss, the modules to shard,
and named parameter groups to freeze. Parallelism is applied from outside the model by the
distributed backend (``parallel.backend``, default ``fsdp2``).

Loss scaling: a recipe returns the *sum* of its per-token (per-sample) losses and the collate
function counts them in ``batch["num_loss_tokens"]``. Each step divides by the count over the
whole global batch (all micro-batches, all ranks), so the loss is the same whether the batch
is split across accumulation steps, ranks, or packed sequences.

Checkpoints (every ``training.checkpoint_every`` steps and at the end) hold model and optimizer
(DCP, reshardable), scheduler, the data position and every RNG state, so a run killed at any
point resumes to the same losses as an uninterrupted one.
"""

from __future__ import annotations

import warnings

import fnmatch
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.faults import crash_point
from mmcore.io import atomic_write_json
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

if TYPE_CHECKING:
    import torch
    from torch import nn

# dcp.save/load without a process group is what we mean in one process: not worth a warning.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

CHECKPOINTS = "checkpoints"
LATEST = "latest"


@dataclass
class TrainRecipe:
    """What a pack supplies to the train engine.

    Attributes:
        build_model: ``(ctx, upstream) -> nn.Module`` on the CPU in fp32, weights already
            loaded (e.g. with :func:`load_converted`). Single-device code.
        dataset: ``(ctx, upstream) -> Sequence`` of samples (map-style: ``len`` and ``[i]``).
        collate: list of samples -> batch dict; must set ``batch["num_loss_tokens"]`` (int).
        loss: ``(model, batch) -> tensor``: the summed loss of the batch.
        shard_modules: ``model -> list of modules`` that the backend shards one by one
            (decoder layers, vision blocks), before the root.
        freeze_groups: group name -> parameter-name globs, for ``training.freeze``
            (e.g. ``{"vision": ["model.visual.*"]}``); globs may also be given directly.
        evaluate: optional ``(ctx, model, step) -> metrics``, called on every rank at step 0,
            every ``training.eval_every`` steps and at the end; logged on the main process.
        loss_unit: what ``num_loss_tokens`` counts, for the throughput metric's name
            (``tokens`` -> ``tokens_per_s``; ``samples`` -> ``samples_per_s``).
        group_of: optional ``sample index -> key``; a micro-batch then only holds samples of
            one key (e.g. one resolution bucket, so latents stack).
    """

    build_model: Callable[[StageContext, Mapping[str, Manifest]], "nn.Module"]
    dataset: Callable[[StageContext, Mapping[str, Manifest]], Sequence[Any]]
    collate: Callable[[list[Any]], dict[str, Any]]
    loss: Callable[["nn.Module", dict[str, Any]], "torch.Tensor"]
    shard_modules: Callable[["nn.Module"], list["nn.Module"]] = lambda model: []
    freeze_groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    evaluate: Callable[[StageContext, "nn.Module", int], dict[str, float]] | None = None
    loss_unit: str = "tokens"
    group_of: Callable[[int], Any] | None = None


# --------------------------------------------------------------------------- helpers


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


def freeze(model: "nn.Module", patterns: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """Freeze parameters matching ``patterns`` (group names or globs); returns the frozen names."""
    globs: list[str] = []
    for pattern in patterns:
        globs.extend(groups.get(pattern, [pattern]))
    frozen = []
    for name, param in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, g) for g in globs):
            param.requires_grad_(False)
            frozen.append(name)
    unmatched = [p for p in patterns if p not in groups and not any(fnmatch.fnmatchcase(n, p) for n, _ in model.named_parameters())]
    if unmatched:
        known = ", ".join(groups) or "none"
        raise StageError(f"training.freeze: {unmatched[0]!r} matches no parameter and is no group (groups: {known})")
    return frozen


def lr_lambda(schedule: str, warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
        return min_ratio + (1 - min_ratio) * shape

    return factor


class EpochSampler:
    """Deterministic shuffled micro-batches, sharded across ranks, resumable at any position.

    With ``groups`` (one key per sample) every global micro-batch holds one group's samples;
    each epoch shuffles within groups, cuts them into global micro-batches (dropping each
    group's ragged tail) and shuffles the order of those.
    """

    def __init__(self, size: int, seed: int, rank: int, world: int, batch: int, groups: list[Any] | None = None) -> None:
        self.seed, self.rank, self.world, self.batch = seed, rank, world, batch
        self.groups = groups if groups is not None else [0] * size
        self.position = 0  # global micro-batches consumed since the start
        self._epoch_cache: tuple[int, list[list[int]]] | None = None
        if not self._plan(0):
            biggest = max(self.groups.count(g) for g in set(self.groups)) if size else 0
            raise StageError(f"the dataset has {size} samples (largest group {biggest}), fewer than one global micro-batch ({world} ranks x {batch})")

    def _plan(self, epoch: int) -> list[list[int]]:
        if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
            return self._epoch_cache[1]
        rng = random.Random(self.seed * 1_000_003 + epoch)
        by_group: dict[Any, list[int]] = {}
        for index, key in enumerate(self.groups):
            by_group.setdefault(key, []).append(index)
        span = self.world * self.batch
        batches = []
        for key in sorted(by_group, key=str):
            members = by_group[key]
            rng.shuffle(members)
            batches += [members[i : i + span] for i in range(0, len(members) - span + 1, span)]
        rng.shuffle(batches)
        self._epoch_cache = (epoch, batches)
        return batches

    def next_batch(self) -> tuple[list[int], int]:
        per_epoch = len(self._plan(0))
        epoch, index = divmod(self.position, per_epoch)
        span = self._plan(epoch)[index]
        self.position += 1
        return span[self.rank * self.batch : (self.rank + 1) * self.batch], epoch


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


# --------------------------------------------------------------------------- the loop


def run_training(ctx: StageContext, upstream: Mapping[str, Manifest], recipe: TrainRecipe) -> StageResult:
    import torch
    import torch.distributed as dist

    from mmcore.registry import import_object

    cfg = ctx.config.training
    world = ctx.world
    accelerator = ctx.accelerator
    device = accelerator.device(world.local_rank)
    seed_everything(ctx.seed + world.rank)

    # ---- setup
    model = recipe.build_model(ctx, upstream)
    frozen = freeze(model, cfg.freeze, recipe.freeze_groups)
    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and accelerator.device_type != "cpu" and accelerator.supports_bf16())
    backend = import_object(ctx.plugins.registry.backend(ctx.config.parallel.backend).factory)() if ctx.plugins else None
    model = backend.prepare(model, recipe.shard_modules(model), device=device, bf16=use_bf16, world=world) if backend else model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise StageError("every parameter is frozen (training.freeze): nothing to train")
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.lr_schedule, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio))
    data = recipe.dataset(ctx, upstream)
    groups = [recipe.group_of(i) for i in range(len(data))] if recipe.group_of else None
    sampler = EpochSampler(len(data), ctx.seed, world.rank, world.world_size, cfg.micro_batch_size, groups)
    ckpt_root = ctx.stage_dir / CHECKPOINTS

    step = 0
    if ctx.resume and (ckpt_root / LATEST).exists():
        step = _load_checkpoint(ckpt_root / LATEST, model, optimizer, scheduler, sampler, world, backend)
        ctx.say(f"resumed from step {step}")
    model.train()

    evals: list[tuple[int, dict[str, float]]] = []

    def log_eval(at: int) -> None:
        if recipe.evaluate is None:
            return
        model.eval()
        with torch.no_grad():
            metrics = recipe.evaluate(ctx, model, at)
        model.train()
        if metrics:
            evals.append((at, metrics))
            ctx.log_metrics(at, {f"eval/{k}": v for k, v in metrics.items()})
            ctx.say(f"eval at step {at}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))

    if step == 0:
        log_eval(0)
    accelerator.reset_peak_memory()
    history: list[dict[str, float]] = []
    last_loss = float("nan")
    bar = ctx.progress(range(step, cfg.steps), total=cfg.steps - step, description="train", unit="step")
    for step in bar:
        # ---- step
        t0 = time.perf_counter()
        micro = [recipe.collate([data[i] for i in sampler.next_batch()[0]]) for _ in range(cfg.grad_accum_steps)]
        counts = torch.tensor([float(sum(b["num_loss_tokens"] for b in micro))], device=device)
        if world.distributed:
            dist.all_reduce(counts)
        global_tokens = max(counts.item(), 1.0)
        loss_sum = torch.zeros((), device=device)
        for batch in micro:
            batch = _to_device(batch, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16 and not backend_handles_precision(backend, world)):
                loss = recipe.loss(model, batch)
            (loss * (world.world_size / global_tokens)).backward()
            loss_sum += loss.detach().float()
        grad_norm = _clip(model, cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if world.distributed:
            dist.all_reduce(loss_sum)
        last_loss = loss_sum.item() / global_tokens
        elapsed = time.perf_counter() - t0
        done = step + 1
        metrics = {
            "loss": last_loss,
            "lr": scheduler.get_last_lr()[0],
            "grad_norm": grad_norm,
            f"{recipe.loss_unit}_per_s": global_tokens / elapsed,
            "step_time_s": elapsed,
            "peak_memory_gb": accelerator.peak_memory_bytes() / 2**30,
        }
        history.append({"step": done, **metrics})
        if done % cfg.log_every == 0 or done == cfg.steps:
            ctx.log_metrics(done, metrics)
        # ---- checkpoint
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            _save_checkpoint(ckpt_root, done, model, optimizer, scheduler, sampler, world, backend)
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            log_eval(done)
        crash_point("train-step", done)
    # ---- finish
    final_step = max(cfg.steps, step)
    _save_checkpoint(ckpt_root, final_step, model, optimizer, scheduler, sampler, world, backend)
    log_eval(final_step)
    if world.is_main:
        _plot(ctx.stage_dir, history, f"{recipe.loss_unit}_per_s")
    notes = [f"final loss {last_loss:.4f} after {final_step} steps", f"metrics: {ctx.stage_dir / 'metrics.jsonl'}, plot: {ctx.stage_dir / 'train.png'}"]
    result_metrics: dict[str, Any] = {"steps": final_step, "final_loss": last_loss, "frozen_parameters": len(frozen), "bf16": use_bf16}
    if evals:
        (first_step, first), (last_step, last) = evals[0], evals[-1]
        for name in last:
            result_metrics[f"eval/{name}"] = last[name]
            if name in first:
                result_metrics[f"eval/{name}@{first_step}"] = first[name]
                notes.insert(0, f"held-out {name}: {first[name]:.4g} at step {first_step} -> {last[name]:.4g} at step {last_step}")
    return StageResult(outputs={"checkpoint": f"{CHECKPOINTS}/{LATEST}"}, metrics=result_metrics, notes=notes)


def backend_handles_precision(backend: Any, world: Any) -> bool:
    return bool(backend is not None and getattr(backend, "handles_precision", lambda w: False)(world))


def _to_device(batch: dict[str, Any], device: "torch.device") -> dict[str, Any]:
    import torch

    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _clip(model: "nn.Module", max_norm: float | None) -> float:
    import torch

    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _save_checkpoint(root: Path, step: int, model: Any, optimizer: Any, scheduler: Any, sampler: EpochSampler, world: Any, backend: Any) -> None:
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


def _load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any, sampler: EpochSampler, world: Any, backend: Any) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = path.resolve()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), no_dist=not world.distributed)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = json.loads((path / "trainer_state.json").read_text())
    scheduler.load_state_dict(extra["scheduler"])
    sampler.position = extra["sampler_position"]
    rng_file = path / f"rng-rank{world.rank:05d}.json"
    if rng_file.exists():  # absent when resuming on more ranks than saved: those start fresh streams
        _set_rng_state(json.loads(rng_file.read_text()))
    return int(extra["step"])


def _plot(stage_dir: Path, history: list[dict[str, float]], throughput: str) -> None:
    """``train.png``: loss and throughput against step, from ``metrics.jsonl`` (all attempts)."""
    path = stage_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else history
    by_step = {int(r["step"]): r for r in rows if "loss" in r}  # a resumed run repeats steps: keep the last
    rows = [by_step[k] for k in sorted(by_step)]
    if not rows:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_title("training loss")
    ax2.plot([r["step"] for r in rows], [r.get(throughput, float("nan")) for r in rows])
    ax2.set_xlabel("step")
    ax2.set_ylabel(throughput.replace("_per_s", "/s"))
    ax2.set_title("throughput")
    fig.tight_layout()
    fig.savefig(stage_dir / "train.png", dpi=90)
    plt.close(fig)

