"""The train engine: one loop for every pack and every backend — setup, step, checkpoint, log.

A pack hands :func:`run_training` a :class:`TrainRecipe` with only what is model-specific:
build the model, its dataset and collate function, batch -> summed loss, the modules to shard,
and named parameter groups to freeze. Parallelism is applied from outside the model by the
distributed backend (``parallel.backend``, default ``fsdp2``; :class:`mmcore.backends.protocol.Backend`
says what the loop asks of it: :mod:`mmcore.backends.fsdp2`, :mod:`mmcore.backends.megatron.backend`).

Loss scaling: a recipe returns the *sum* of its per-token (per-sample) losses and the collate
function counts them in ``batch["num_loss_tokens"]``. Each step divides by the count over the
whole global batch (all micro-batches, all ranks), so the loss is the same whether the batch
is split across accumulation steps, ranks, or packed sequences.

Checkpoints (every ``training.checkpoint_every`` steps and at the end) hold model and optimizer
(DCP, reshardable), scheduler, the data position and every RNG state, so a run killed at any
point resumes to the same losses as an uninterrupted one. With ``training.ema`` they also hold
the moving average of the trained weights (:mod:`mmcore.train.ema`), written at the end as the
``ema`` output that export reads.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.backends.protocol import Backend, Prepared
from mmcore.checkpoint.training import CHECKPOINTS, load_converted, newest_complete
from mmcore.framework.context import StageContext
from mmcore.train.ema import EMA_OUTPUT, MovingAverage
from mmcore.errors import StageError
from mmcore.framework.faults import crash_point
from mmcore.train.flops import utilisation
from mmcore.backends.fsdp2 import _check_same_adapters  # noqa: F401  (its old place: tests and callers import it here)
from mmcore.train.metric_log import MetricLog
from mmcore.train.guards import GlobalRngCheck, NonFinite, refuse_nonfinite_checkpoint
from mmcore.train.optim import build_optimizer, freeze, lr_lambda, run_schedule
from mmcore.framework.pack import StageResult
from mmcore.train.plot import plot_training
from mmcore.train.prefetch import Prefetch
from mmcore.run.rundir import Manifest
from mmcore.train.sampler import EpochSampler, TokenBudgetSampler, planned_steps, sampler_notes
from mmcore.train.progress import TrainProgress
from mmcore.train.recipe import TrainRecipe
from mmcore.train.rollouts import Rollouts, check_method

if TYPE_CHECKING:
    import torch


# --------------------------------------------------------------------------- the stage


def train_stage(ctx: StageContext, upstream: Mapping[str, Manifest], *, recipe: Callable[[StageContext, Mapping[str, Manifest]], TrainRecipe]) -> StageResult:
    """The train stage, bound in a pack's declared stages to its recipe factory::

    "train": Stage("mmcore.train.loop:train_stage", parts={"recipe": "mm_pack_x.model:recipe"})
    """
    return run_training(ctx, upstream, recipe(ctx, upstream))


# --------------------------------------------------------------------------- the loop


def run_training(ctx: StageContext, upstream: Mapping[str, Manifest], recipe: TrainRecipe, backend: Backend | None = None) -> StageResult:
    """Train ``recipe``'s model on ``backend`` (default: ``parallel.backend``'s, from the
    registry; :class:`mmcore.backends.protocol.Backend`): the same loop for every backend."""
    import torch

    from mmcore.framework.registry import import_object

    cfg, world, accelerator = ctx.config.training, ctx.world, ctx.accelerator
    device = accelerator.device(world.local_rank)
    ckpt_root = ctx.stage_dir / CHECKPOINTS

    # ---- setup: this rank's model (the backend's), the optimizer, the data, the schedule
    check_method(ctx, recipe)
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
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, run_schedule(cfg, planned))
    # training.ema: this rank's part of the average, each tensor as its parameter
    ema = MovingAverage(((n, p) for n, p in model.named_parameters() if p.requires_grad), cfg.ema) if cfg.ema else None
    step = filled = mixed = 0
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
    peak_flops = accelerator.peak_flops() if recipe.flops is not None else None
    history: list[dict[str, float]] = []
    bar = TrainProgress(ctx, step, planned)  # absolute steps, the loss, elapsed and ETA
    rng_check = GlobalRngCheck.wanted(recipe, device)  # MMCORE_CHECK_GLOBAL_RNG=1 (conformance)
    rollouts = Rollouts.of(ctx, recipe, model, device, ready)  # GRPO: the step's answers sampled by the model
    # training.prefetch: the next step's batches read and collated while this one computes (not
    # for GRPO, whose later steps of a rollout reuse its batches)
    prefetch = Prefetch(data, recipe.collate, cfg.grad_accum_steps, step_on_cpu=device.type == "cpu") if rollouts is None and Prefetch.wanted(sampler, cfg.prefetch) else None
    with MetricLog(ctx) as log:  # the sinks get the rows in bursts (mmcore.train.metric_log)
        for step in bar:
            # ---- step
            t0 = time.perf_counter()
            if rollouts is None or rollouts.draws(step):
                micro, global_tokens, data_time, spread = step_batches(ctx, recipe, sampler, data, step, device, ready, prefetch)
                if prefetch is not None and step + 1 < planned:
                    prefetch.ahead(sampler)
                sampled = rollouts.sample(micro, step) if rollouts is not None else None
                if sampled is not None:
                    micro, global_tokens = sampled
            else:  # the rollout's later steps (training.grpo.epochs)
                micro, global_tokens, data_time, spread = rollouts.reuse()
            if rollouts is not None and rollouts.fresh_optimizer(step):
                optimizer.state.clear()  # the warm-up's moments are of another loss (training.grpo.fresh_optimizer)
            before = rng_check.state() if rng_check else []
            loss_sum, flops = backend.forward_backward(micro, global_tokens)
            if rng_check:
                rng_check.check(step + 1, before)
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
            metrics.update({name: total / (global_tokens if count is None else count) for name, (total, count) in extra.items() if count != 0})
            metrics.update(spread)
            if rollouts is not None and rollouts.seconds:
                metrics["rollout_share"] = rollouts.seconds / elapsed  # sampling the answers, of the whole step
            if nonfinite.skipped:
                metrics["skipped_steps"] = nonfinite.skipped
            filled += int(spread.get("fillers", 0))
            mixed += int(spread.get("mixed_media", 0))
            if recipe.flops is not None:
                metrics.update(utilisation(flops, elapsed, peak_flops))
            history.append({"step": done, **metrics})
            metrics.update({"epoch": sampler.position / sampler.epoch_length()} if cfg.epochs is not None else {})  # passes over the data so far
            if done % cfg.log_every == 0 or done == planned:
                log.add(done, metrics)
            # ---- checkpoint
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < planned:
                log.flush()  # every row up to the checkpoint written: a resume from it logs only later steps
                refuse_nonfinite_checkpoint(ready.trained, world, done, ckpt_root, device, group=ready.finite_group)
                backend.save(ckpt_root, done, optimizer, scheduler, sampler, last_loss, ema)
            if cfg.eval_every and done % cfg.eval_every == 0 and done < planned:
                log.flush()
                evals.record(done, backend.evaluate(ctx, recipe, done))
            crash_point("train-step", done)
    if prefetch is not None:
        prefetch.close()
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
    notes = [
        f"final loss {last_loss:.4f} after {final_step} steps" + (f" ({cfg.epochs} epochs)" if cfg.epochs else "") + finished.where,
        f"metrics: {ctx.stage_dir / 'metrics.jsonl'}, plot: {ctx.stage_dir / 'train.png'}",
        *finished.notes,
        *sampler_notes(sampler),
    ]
    result_metrics: dict[str, Any] = {"steps": final_step, "final_loss": last_loss, "frozen_parameters": ready.frozen, "bf16": ready.bf16, "recompute": cfg.recompute, **finished.metrics}
    if mixed:
        result_metrics["mixed_media_steps"] = mixed
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


def _step_metrics(recipe: TrainRecipe, device: Any, world: Any) -> dict[str, tuple[float, float | None]]:
    """The recipe's sums of this step and their counts (None: the step's loss units), summed
    over processes (one reduction for all)."""
    if recipe.step_metrics is None:
        return {}
    import torch
    import torch.distributed as dist

    sums = recipe.step_metrics()
    if not sums:
        return {}
    names = sorted(sums)
    pairs = [sums[n] if isinstance(sums[n], tuple) else (sums[n], None) for n in names]  # (sum, count): a mean of its own
    values = torch.stack([torch.as_tensor(part, dtype=torch.float32).detach().float().to(device) for pair in pairs for part in (pair[0], 0.0 if pair[1] is None else pair[1])])
    if world.distributed:
        dist.all_reduce(values)
    flat = values.tolist()
    return {name: (flat[2 * i], flat[2 * i + 1] if pairs[i][1] is not None else None) for i, name in enumerate(names)}


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


def step_batches(
    ctx: StageContext, recipe: TrainRecipe, sampler: Any, data: Sequence[Any], step: int, device: "torch.device", ready: Prepared | None = None, prefetch: Prefetch | None = None
) -> tuple[list[dict[str, Any]], float, float, dict[str, float]]:
    """This rank's micro-batches of the step (on the CPU), the step's loss tokens over all
    data-parallel ranks, the seconds spent reading and collating (or waiting for ``prefetch``,
    which read them ahead), and how the step's work spread over the ranks (``tower_balance``,
    ``mixed_media``: 1 where its ranks held different media, ``fillers``). ``ready``: where the backend placed this rank (its data-parallel replica and
    group; default: every process is one).

    One reduction carries the loss tokens, each rank's tower work, which media kinds each
    micro-batch holds and the counts of the recipe's ``loss_terms`` (handed to every micro-batch
    as ``global_loss_counts``); a micro-batch lacking a kind another rank's holds is collated again with
    that kind's filler (:mod:`mmcore.data.fillers`), so every rank calls the same towers.
    """
    import torch
    import torch.distributed as dist

    world = ctx.world
    rank, ranks = (ready.data_rank, ready.data_ranks) if ready is not None else (world.rank, world.world_size)
    group = ready.data_group if ready is not None else None
    t0 = time.perf_counter()
    drawn = [sampler.next_batch()[0] for _ in range(ctx.config.training.grad_accum_steps)]
    ahead = prefetch.take(drawn) if prefetch is not None else None
    samples, micro = ahead if ahead is not None else ([[data[i] for i in indices] for indices in drawn], None)
    micro = micro if micro is not None else [recipe.collate(chosen) for chosen in samples]
    data_time = time.perf_counter() - t0
    media = recipe.fill if recipe.fill is not None and (ready is None or ready.fills) else recipe.media
    held = media.presence(drawn) if media is not None and ranks > 1 else []
    work = [0.0] * ranks if recipe.work_of is not None and ranks > 1 else []
    if work:
        work[rank] = sum(recipe.work_of(i) for indices in drawn for i in indices)
    terms = list(recipe.loss_terms)
    reduced = [float(sum(b["num_loss_tokens"] for b in micro)), *work, *held, *(float(sum(b["loss_counts"].get(t, 0) for b in micro)) for t in terms)]
    if world.distributed or group is not None:  # one process: the sums are its own (no tensor, no copy to the device)
        together = torch.tensor(reduced, dtype=_count_dtype(device), device=device)
        dist.all_reduce(together, group=group)
        reduced = together.tolist()
    t1 = time.perf_counter()
    spread: dict[str, float] = {}
    if work:
        spread["tower_balance"] = tower_balance(reduced[1 : 1 + len(work)])
    if held:
        present = reduced[1 + len(work) : 1 + len(work) + len(held)]
        spread["mixed_media"] = float(any(0 < n < ranks for n in present))
        if media is recipe.fill:
            spread["fillers"] = filler_count(present, ranks)
            for accum, kinds in enumerate(recipe.fill.missing(held, present)):
                if kinds:
                    micro[accum] = recipe.fill.collate(samples[accum], kinds)
    if terms:  # after the fillers: a filled micro-batch is collated anew
        counts = {"all": max(reduced[0], 1.0), **dict(zip(terms, reduced[len(reduced) - len(terms) :]))}
        for batch in micro:
            batch["global_loss_counts"] = counts
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
