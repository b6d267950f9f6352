"""The train engine: one loop for every pack and every backend — setup, step, checkpoint, log.

A pack hands :func:`run_training` a :class:`TrainRecipe` with only what is model-specific:
build the model, its dataset and collate function, batch -> summed loss, the modules to shard,
and named parameter groups to freeze. Parallelism is applied from outside the model by the
distributed backend (``parallel.backend``, default ``fsdp2``; :class:`mmcore.backend.Backend`
says what the loop asks of it: :mod:`mmcore.fsdp2`, :mod:`mmcore.megatron.backend`).

Loss scaling: a recipe returns the *sum* of its per-token (per-sample) losses and the collate
function counts them in ``batch["num_loss_tokens"]``. Each step divides by the count over the
whole global batch (all micro-batches, all ranks), so the loss is the same whether the batch
is split across accumulation steps, ranks, or packed sequences.

Checkpoints (every ``training.checkpoint_every`` steps and at the end) hold model and optimizer
(DCP, reshardable), scheduler, the data position and every RNG state, so a run killed at any
point resumes to the same losses as an uninterrupted one. With ``training.ema`` they also hold
the moving average of the trained weights (:mod:`mmcore.ema`), written at the end as the
``ema`` output that export reads.
"""

from __future__ import annotations

import math
import time
import warnings
from types import MappingProxyType
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.backend import Backend, Prepared
from mmcore.checkpointing import CHECKPOINTS, load_converted, newest_complete
from mmcore.context import StageContext
from mmcore.ema import EMA_OUTPUT, MovingAverage
from mmcore.errors import StageError
from mmcore.faults import crash_point
from mmcore.flops import utilisation
from mmcore.fsdp2 import _check_same_adapters  # noqa: F401  (its old place: tests and callers import it here)
from mmcore.guards import NonFinite, refuse_nonfinite_checkpoint
from mmcore.optim import build_optimizer, freeze, lr_lambda
from mmcore.pack import StageResult
from mmcore.plot import plot_training
from mmcore.rundir import Manifest
from mmcore.sampler import EpochSampler, TokenBudgetSampler, planned_steps, sampler_notes
from mmcore.train_progress import TrainProgress

if TYPE_CHECKING:
    import torch
    from torch import nn


class TrainRecipe:
    """What a pack supplies to the train engine: a subclass whose methods are the model's part
    of training (what the kits do: ``VLMRecipe``, ``DiffusionRecipe``), or, as SDK 1.x packs do,
    an instance built from keyword parts (``TrainRecipe(build_model=..., loss=...)``), each part
    a callable that takes the place of the method of that name.

    The four parts every recipe has are methods (:meth:`build_model`, :meth:`dataset`,
    :meth:`collate`, :meth:`loss`); the optional ones are ``None`` until a subclass defines
    them or a keyword gives them, and the engine reads ``None`` as "not used".

    A backend that needs more of a recipe asks through a protocol of its own, which a subclass
    implements beside these parts: ``parallel.backend: megatron`` a
    :class:`mmcore.megatron.family.MegatronRecipe` (``megatron_family(ctx, upstream)``). The
    SDK 1.x keyword ``megatron=`` (that method as a callable) is still accepted, deprecated
    until SDK 2.0.

    Attributes:
        build_model: ``(ctx, upstream) -> nn.Module`` in fp32, single-device code. With
            ``weights`` it builds without loading (the engine calls it with parameters on the
            meta device, shards, then loads each rank's part); without, it returns the model
            on the CPU with weights loaded (e.g. with :func:`load_converted`).
        weights: optional ``(ctx, upstream) -> DCP checkpoint`` to start from (convert's).
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
        length_of: optional ``sample index -> tokens``, for ``training.max_tokens`` (packed
            rows filled to a token budget); recipes that pack provide it.
        flops: optional ``(model, batch) -> float``: FLOPs of one forward and backward of the
            batch (:mod:`mmcore.flops`), for the ``tflops`` and ``mfu`` metrics.
        lora_targets: the default of ``training.lora.target_modules`` (groups or module globs),
            among the linear layers of ``shard_modules``' blocks; empty: all of those layers.
        prepare: optional ``(ctx, model) -> None``, called once on every rank when the model is
            ready (weights loaded, or resumed) and before the first step, without gradients, in
            eval mode: what a loss needs from the starting weights (DPO's reference
            log-probabilities, :mod:`mmcore.preference`).
        step_metrics: optional ``() -> {name: tensor}``: sums over the step's loss units of
            what the loss measured besides itself (DPO's rewards), read and reset after every
            step; the engine sums them over processes and divides by the step's loss units.
        sample_seeds: the engine adds ``batch["sample_seeds"]`` (int64, one per sample): a seed
            from ``run.seed``, the step, the accumulation index and the sample's index, for a loss
            that draws random numbers (noise levels, noise, caption dropout) per sample. The draws
            then do not depend on how samples are cut into micro-batches or ranks, nor on a
            resume (``sample_seed``).
        fill: optional :class:`~mmcore.data.fillers.Fill`, for a model whose towers run only on
            the media a batch holds: a rank whose micro-batch lacks a media kind that another
            rank's holds collates it with that kind's filler, so every rank calls the same
            towers (their sharded collectives) in the same order.
        work_of: optional ``sample index -> tokens through the towers`` (vision patches, audio
            frames): the samplers give the data-parallel ranks of a step alike tower work, and
            the ``tower_balance`` metric (the busiest rank's tower tokens over the ranks' mean)
            says how alike.
    """

    # optional parts: None means the recipe does not use it
    weights: Callable[[StageContext, Mapping[str, Manifest]], Path] | None = None
    evaluate: Callable[[StageContext, "nn.Module", int], dict[str, float]] | None = None
    group_of: Callable[[int], Any] | None = None
    flops: Callable[["nn.Module", dict[str, Any]], float] | None = None
    length_of: Callable[[int], int] | None = None
    prepare: Callable[[StageContext, "nn.Module"], None] | None = None
    step_metrics: Callable[[], dict[str, "torch.Tensor"]] | None = None
    fill: Any = None
    work_of: Callable[[int], float] | None = None
    # settings
    freeze_groups: Mapping[str, Sequence[str]] = MappingProxyType({})
    loss_unit: str = "tokens"
    lora_targets: Sequence[str] = ()
    sample_seeds: bool = False

    _REQUIRED = ("build_model", "dataset", "collate", "loss")

    def __init__(self, **parts: Any) -> None:
        megatron = parts.pop("megatron", None)  # SDK 1.x, deprecated until 2.0: MegatronRecipe's megatron_family
        if megatron is not None:
            warnings.warn("TrainRecipe(megatron=...) is deprecated and goes in SDK 2.0: define megatron_family(ctx, upstream) in a TrainRecipe "
                          "subclass (mmcore.megatron.family.MegatronRecipe)", DeprecationWarning, stacklevel=2)
            self.megatron_family = megatron
        known = set(self._REQUIRED) | {"shard_modules"} | {name for name in vars(TrainRecipe) if not name.startswith("_") and not callable(getattr(TrainRecipe, name))}
        unknown = sorted(set(parts) - known)
        if unknown:
            raise TypeError(f"TrainRecipe got unknown part(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        missing = [name for name in self._REQUIRED if name not in parts and getattr(type(self), name) is getattr(TrainRecipe, name)]
        if missing:
            raise TypeError(f"TrainRecipe needs {', '.join(missing)} (a keyword part or a method of {type(self).__name__})")
        for name, value in parts.items():
            setattr(self, name, value)

    def build_model(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> "nn.Module":
        """The model in fp32, single-device code (see ``build_model`` above)."""
        raise NotImplementedError

    def dataset(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Sequence[Any]:
        """The training samples, map-style (``len`` and ``[i]``)."""
        raise NotImplementedError

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        """Samples -> one micro-batch; sets ``batch["num_loss_tokens"]``."""
        raise NotImplementedError

    def loss(self, model: "nn.Module", batch: dict[str, Any]) -> "torch.Tensor":
        """The summed loss of the batch (the engine divides by the global batch's loss units)."""
        raise NotImplementedError

    def shard_modules(self, model: "nn.Module") -> list["nn.Module"]:
        """The modules the backend shards one by one before the root (none by default)."""
        return []


# --------------------------------------------------------------------------- the stage


def train_stage(ctx: StageContext, upstream: Mapping[str, Manifest], *, recipe: Callable[[StageContext, Mapping[str, Manifest]], TrainRecipe]) -> StageResult:
    """The train stage, bound in a pack's declared stages to its recipe factory::

        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_x.model:recipe"})
    """
    return run_training(ctx, upstream, recipe(ctx, upstream))


# --------------------------------------------------------------------------- the loop


def run_training(ctx: StageContext, upstream: Mapping[str, Manifest], recipe: TrainRecipe, backend: Backend | None = None) -> StageResult:
    """Train ``recipe``'s model on ``backend`` (default: ``parallel.backend``'s, from the
    registry; :class:`mmcore.backend.Backend`): the same loop for every backend."""
    import torch

    from mmcore.registry import import_object

    cfg, world, accelerator = ctx.config.training, ctx.world, ctx.accelerator
    device = accelerator.device(world.local_rank)
    ckpt_root = ctx.stage_dir / CHECKPOINTS

    # ---- setup: this rank's model (the backend's), the optimizer, the data, the schedule
    if backend is None:
        assert ctx.plugins is not None, "the train stage runs with the registry's backends"
        backend = import_object(ctx.plugins.registry.backend(ctx.config.parallel.backend).factory)()
    resume_from = newest_complete(ckpt_root) if ctx.resume else None
    ready = backend.setup(ctx, upstream, recipe, resume_from)
    model = ready.model
    optimizer = build_optimizer(ready.optimizer_params, cfg)
    data = recipe.dataset(ctx, upstream)
    sampler = _sampler(ctx, recipe, data, ready.data_rank, ready.data_ranks)
    planned = planned_steps(cfg, sampler, ctx.say)  # training.steps, or training.epochs of this data
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.lr_schedule, cfg.warmup_steps, planned, cfg.min_lr_ratio))
    # training.ema: this rank's part of the average, each tensor as its parameter
    ema = MovingAverage(((n, p) for n, p in model.named_parameters() if p.requires_grad), cfg.ema) if cfg.ema else None
    step = filled = 0
    last_loss = float("nan")
    resumed = backend.start(resume_from, optimizer, scheduler, sampler, ema)
    if resumed is not None:
        step, last_loss = resumed.step, resumed.loss
        ctx.say(f"resumed from step {step}{resumed.how}")
        ctx.resumed_metrics_at(step)
    if recipe.prepare is not None:
        model.eval()
        with torch.no_grad():
            recipe.prepare(ctx, model)
    model.train()
    evals = HeldOutLog(ctx)
    nonfinite = NonFinite(cfg.on_nonfinite, ckpt_root)
    if step == 0:
        evals.record(0, backend.evaluate(ctx, recipe, 0))
    accelerator.reset_peak_memory()
    history: list[dict[str, float]] = []
    bar = TrainProgress(ctx, step, planned)  # absolute steps, the loss, elapsed and ETA
    for step in bar:
        # ---- step
        t0 = time.perf_counter()
        micro, global_tokens, data_time, spread = step_batches(ctx, recipe, sampler, data, step, device, ready)
        loss_sum, flops = backend.forward_backward(micro, global_tokens)
        grad_norm = backend.clip_gradients(cfg.max_grad_norm)  # model-wide: the same on every rank
        total, finite_everywhere = backend.reduce_loss(loss_sum)  # before the update: every rank updates, stops or skips alike
        bar.loss = step_loss = total / global_tokens  # a float already: the progress line costs no sync
        seen = step_loss if finite_everywhere or not math.isfinite(step_loss) else float("nan")  # another rank's loss was not finite
        applies = nonfinite.check(step + 1, seen, grad_norm)
        if applies:
            optimizer.step()
            last_loss = step_loss
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None and applies:
            ema.update(step + 1)
        extra = _step_metrics(recipe, device, world)
        elapsed = time.perf_counter() - t0
        done = step + 1
        metrics = {
            "loss": step_loss,
            "lr": scheduler.get_last_lr()[0],
            "grad_norm": grad_norm,
            f"{recipe.loss_unit}_per_s": global_tokens / elapsed,
            "step_time_s": elapsed,
            "data_time_s": data_time,
            "peak_memory_gb": accelerator.peak_memory_bytes() / 2**30,
        }
        metrics.update({name: value / global_tokens for name, value in extra.items()})
        metrics.update(spread)
        if nonfinite.skipped:
            metrics["skipped_steps"] = nonfinite.skipped
        filled += int(spread.get("fillers", 0))
        if recipe.flops is not None:
            metrics.update(utilisation(flops, elapsed, accelerator))
        history.append({"step": done, **metrics})
        metrics.update({"epoch": sampler.position / sampler.epoch_length()} if cfg.epochs is not None else {})  # passes over the data so far
        if done % cfg.log_every == 0 or done == planned:
            ctx.log_metrics(done, metrics)
        # ---- checkpoint
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < planned:
            refuse_nonfinite_checkpoint(ready.trained, world, done, ckpt_root, device, group=ready.finite_group)
            backend.save(ckpt_root, done, optimizer, scheduler, sampler, last_loss, ema)
        if cfg.eval_every and done % cfg.eval_every == 0 and done < planned:
            evals.record(done, backend.evaluate(ctx, recipe, done))
        crash_point("train-step", done)
    # ---- finish: the last checkpoint, then the backend's outputs for export
    final_step = max(planned, step)
    refuse_nonfinite_checkpoint(ready.trained, world, final_step, ckpt_root, device, group=ready.finite_group)
    backend.save(ckpt_root, final_step, optimizer, scheduler, sampler, last_loss, ema)
    finished = backend.finish(ckpt_root, ema)
    crash_point("train-end", 1)
    evals.record(final_step, backend.evaluate(ctx, recipe, final_step))
    if world.is_main:
        plot_training(ctx.stage_dir, history, f"{recipe.loss_unit}_per_s")
    backend.close()
    notes = [f"final loss {last_loss:.4f} after {final_step} steps" + (f" ({cfg.epochs} epochs)" if cfg.epochs else "") + finished.where,
             f"metrics: {ctx.stage_dir / 'metrics.jsonl'}, plot: {ctx.stage_dir / 'train.png'}", *finished.notes, *sampler_notes(sampler)]
    result_metrics: dict[str, Any] = {"steps": final_step, "final_loss": last_loss, "frozen_parameters": ready.frozen, "bf16": ready.bf16,
                                      "recompute": cfg.recompute, **finished.metrics}
    if filled:
        result_metrics["fillers"] = filled
        notes.append(f"{filled} filler(s) kept the ranks' tower calls alike where their micro-batches held different media (this run's steps)")
    if nonfinite.skipped:
        result_metrics["skipped_steps"] = nonfinite.skipped
        notes.append(f"{nonfinite.skipped} step(s) skipped: their loss or gradient norm was not finite (training.on_nonfinite: skip); the final loss is the last finite one")
    evals.summarise(result_metrics, notes)
    if ema is not None:
        result_metrics["ema"] = cfg.ema
        notes.append(f"moving average of the trained weights (decay {cfg.ema}) at {ckpt_root / EMA_OUTPUT}: what export writes (export.weights)")
    return StageResult(outputs=finished.outputs, metrics=result_metrics, notes=notes)


class HeldOutLog:
    """Held-out metrics through a run: each logged as ``eval/<name>`` at its step and said, the
    first and last summed up in the stage's result (any backend's loop)."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx, self.evals = ctx, []  # type: list[tuple[int, dict[str, float]]]

    def record(self, at: int, metrics: Mapping[str, float]) -> None:
        if metrics:
            self.evals.append((at, dict(metrics)))
            self.ctx.log_metrics(at, {f"eval/{k}": v for k, v in metrics.items()})
            self.ctx.say(f"eval at step {at}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))

    def summarise(self, result_metrics: dict[str, Any], notes: list[str]) -> None:
        """``eval/<name>`` (the last) and ``eval/<name>@<first step>`` into ``result_metrics``, a
        first -> last line per metric at the top of ``notes``."""
        if not self.evals:
            return
        (first_step, first), (last_step, last) = self.evals[0], self.evals[-1]
        for name in last:
            result_metrics[f"eval/{name}"] = last[name]
            if name in first:
                result_metrics[f"eval/{name}@{first_step}"] = first[name]
                notes.insert(0, f"held-out {name}: {first[name]:.4g} at step {first_step} -> {last[name]:.4g} at step {last_step}")


def _step_metrics(recipe: TrainRecipe, device: Any, world: Any) -> dict[str, float]:
    """The recipe's sums of this step, summed over processes (one reduction for all)."""
    if recipe.step_metrics is None:
        return {}
    import torch
    import torch.distributed as dist

    sums = recipe.step_metrics()
    if not sums:
        return {}
    names = sorted(sums)
    values = torch.stack([sums[n].detach().float().to(device) for n in names])
    if world.distributed:
        dist.all_reduce(values)
    return dict(zip(names, values.tolist()))


def sample_seed(seed: int, step: int, accum: int, index: int) -> int:
    """The seed of one sample's random draws at one step (63 bits, the same on every machine)."""
    import hashlib

    digest = hashlib.sha256(f"{seed}:{step}:{accum}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _sampler(ctx: StageContext, recipe: TrainRecipe, data: Sequence[Any], rank: int | None = None, ranks: int | None = None) -> Any:
    """The step sampler of this data-parallel replica (``rank`` of ``ranks``; default: the world's)."""
    cfg, world = ctx.config.training, ctx.world
    rank = world.rank if rank is None else rank
    ranks = world.world_size if ranks is None else ranks
    costs = [recipe.work_of(i) for i in range(len(data))] if recipe.work_of is not None and cfg.balance_towers else None
    if cfg.max_tokens is None:
        groups = [recipe.group_of(i) for i in range(len(data))] if recipe.group_of else None
        return EpochSampler(len(data), ctx.seed, rank, ranks, cfg.micro_batch_size, groups, costs=costs)
    if not cfg.packing or recipe.length_of is None:
        why = "set training.packing: true" if recipe.length_of is not None else f"pack {ctx.pack!r} does not pack rows"
        raise StageError(f"training.max_tokens fills packed rows to a token budget: {why}")
    if recipe.group_of is not None:
        raise StageError(f"training.max_tokens: pack {ctx.pack!r} keeps kinds of samples in separate micro-batches, which the token-budget sampler does not do yet; use training.micro_batch_size")
    return TokenBudgetSampler([recipe.length_of(i) for i in range(len(data))], cfg.max_tokens, ctx.seed, rank, ranks, costs=costs)


def computes_in_bf16(precision: str, accelerator: Any) -> bool:
    """``training.precision``: ``bf16``, or ``auto`` on an accelerator (not the CPU) that has it."""
    return precision == "bf16" or (precision == "auto" and accelerator.device_type != "cpu" and accelerator.supports_bf16())



def step_batches(ctx: StageContext, recipe: TrainRecipe, sampler: Any, data: Sequence[Any], step: int,
                 device: "torch.device", ready: Prepared | None = None) -> tuple[list[dict[str, Any]], float, float, dict[str, float]]:
    """This rank's micro-batches of the step (on the CPU), the step's loss tokens over all
    data-parallel ranks, the seconds spent reading and collating, and how the step's work spread
    over the ranks (``tower_balance``, ``fillers``). ``ready``: where the backend placed this
    rank (its data-parallel replica and group; default: every process is one).

    One reduction carries the loss tokens, each rank's tower work and which media kinds each
    micro-batch holds; a micro-batch lacking a kind another rank's holds is collated again with
    that kind's filler (:mod:`mmcore.data.fillers`), so every rank calls the same towers.
    """
    import torch
    import torch.distributed as dist

    world = ctx.world
    rank, ranks = (ready.data_rank, ready.data_ranks) if ready is not None else (world.rank, world.world_size)
    group = ready.data_group if ready is not None else None
    t0 = time.perf_counter()
    drawn = [sampler.next_batch()[0] for _ in range(ctx.config.training.grad_accum_steps)]
    samples = [[data[i] for i in indices] for indices in drawn]
    micro = [recipe.collate(chosen) for chosen in samples]
    data_time = time.perf_counter() - t0
    fills = recipe.fill is not None and ranks > 1 and (ready is None or ready.fills)
    held = recipe.fill.presence(drawn) if fills else []
    work = [0.0] * ranks if recipe.work_of is not None and ranks > 1 else []
    if work:
        work[rank] = sum(recipe.work_of(i) for indices in drawn for i in indices)
    counts = torch.tensor([float(sum(b["num_loss_tokens"] for b in micro)), *work, *held], dtype=_count_dtype(device), device=device)
    if world.distributed or group is not None:
        dist.all_reduce(counts, group=group)
    reduced = counts.tolist()
    t1 = time.perf_counter()
    spread: dict[str, float] = {}
    if work:
        spread["tower_balance"] = tower_balance(reduced[1 : 1 + len(work)])
    if held:
        present = reduced[1 + len(work) :]
        spread["fillers"] = filler_count(present, ranks)
        for accum, kinds in enumerate(recipe.fill.missing(held, present)):
            if kinds:
                micro[accum] = recipe.fill.collate(samples[accum], kinds)
    if recipe.sample_seeds:
        for accum, indices in enumerate(drawn):
            micro[accum]["sample_seeds"] = torch.tensor([sample_seed(ctx.seed, step, accum, i) for i in indices], dtype=torch.long)
    return micro, max(reduced[0], 1.0), data_time + time.perf_counter() - t1, spread


def filler_count(presence: Sequence[float], world_size: int) -> int:
    """Fillers the ranks add in a step: for each micro-batch and media kind some rank holds, one
    per rank that lacks it (``presence``: the kinds' rank counts, summed over ranks)."""
    return int(sum(world_size - n for n in presence if n > 0))


def tower_balance(work: Sequence[float]) -> float:
    """The busiest rank's tower tokens over the ranks' mean (1: even; world size: one rank
    did it all); 1 for a step that ran no tower."""
    mean = sum(work) / len(work)
    return max(work) / mean if mean else 1.0


def _count_dtype(device: "torch.device") -> "torch.dtype":
    """Exact integer sums beyond 2**24 tokens; float32 where the collective library has no float64 (NPU)."""
    import torch

    return torch.float32 if device.type == "npu" else torch.float64



__all__ = ["TrainRecipe", "train_stage", "run_training", "load_converted", "EpochSampler", "lr_lambda", "freeze", "sample_seed"]
