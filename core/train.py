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
point resumes to the same losses as an uninterrupted one. With ``training.ema`` they also hold
the moving average of the trained weights (:mod:`mmcore.ema`), written at the end as the
``ema`` output that export reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.checkpointing import CHECKPOINTS, LATEST, load_checkpoint, load_converted, newest_complete, save_average, save_checkpoint, seed_everything
from mmcore.context import StageContext
from mmcore.ema import EMA_OUTPUT, MovingAverage
from mmcore.errors import StageError
from mmcore.faults import crash_point
from mmcore.flops import utilisation
from mmcore.guards import NonFinite, lora_size_warning, refuse_nonfinite_checkpoint
from mmcore.io import ensure_free_space
from mmcore.optim import STATE_COPIES, build_optimizer, clip_grad_norm, freeze, lr_lambda
from mmcore.pack import StageResult
from mmcore.plot import plot_training
from mmcore.recompute import apply_recompute
from mmcore.rundir import Manifest, RunDir
from mmcore.sampler import EpochSampler, TokenBudgetSampler, planned_steps, sampler_notes
from mmcore.sharded_load import load_weights, materialise, on_meta, parameters_on_meta
from mmcore.train_progress import TrainProgress

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class TrainRecipe:
    """What a pack supplies to the train engine.

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
        megatron: optional ``(ctx, upstream) -> MegatronFamily`` (:mod:`mmcore.megatron.engine`):
            the family on megatron-core, for ``parallel.backend: megatron``.
        fill: optional :class:`~mmcore.data.fillers.Fill`, for a model whose towers run only on
            the media a batch holds: a rank whose micro-batch lacks a media kind that another
            rank's holds collates it with that kind's filler, so every rank calls the same
            towers (their sharded collectives) in the same order.
        work_of: optional ``sample index -> tokens through the towers`` (vision patches, audio
            frames): the samplers give the data-parallel ranks of a step alike tower work, and
            the ``tower_balance`` metric (the busiest rank's tower tokens over the ranks' mean)
            says how alike.
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
    weights: Callable[[StageContext, Mapping[str, Manifest]], Path] | None = None
    flops: Callable[["nn.Module", dict[str, Any]], float] | None = None
    length_of: Callable[[int], int] | None = None
    lora_targets: Sequence[str] = ()
    prepare: Callable[[StageContext, "nn.Module"], None] | None = None
    step_metrics: Callable[[], dict[str, "torch.Tensor"]] | None = None
    sample_seeds: bool = False
    megatron: Callable[[StageContext, Mapping[str, Manifest]], Any] | None = None
    fill: Any = None
    work_of: Callable[[int], float] | None = None


# --------------------------------------------------------------------------- the stage


def train_stage(ctx: StageContext, upstream: Mapping[str, Manifest], *, recipe: Callable[[StageContext, Mapping[str, Manifest]], TrainRecipe]) -> StageResult:
    """The train stage, bound in a pack's declared stages to its recipe factory::

        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_x.model:recipe"})
    """
    return run_training(ctx, upstream, recipe(ctx, upstream))


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

    # ---- setup: build (without memory where the recipe loads through the engine), freeze,
    # recompute, shard, then materialise and load each rank's shards
    use_bf16 = computes_in_bf16(cfg.precision, accelerator)
    if cfg.cpu_offload and accelerator.device_type == "cpu":
        raise StageError("training.cpu_offload keeps weights in host memory while an accelerator computes; this run computes on the CPU (run.device: cpu)")
    backend = import_object(ctx.plugins.registry.backend(ctx.config.parallel.backend).factory)() if ctx.plugins else None
    if hasattr(backend, "train"):  # a backend that owns the loop (pipeline schedules): megatron
        return backend.train(ctx, upstream, recipe)
    split = ctx.config.parallel
    if split.tensor_parallel > 1 or split.pipeline_parallel > 1 or split.sequence_parallel or split.virtual_pipeline > 1:
        raise StageError(f"parallel.tensor_parallel / pipeline_parallel / sequence_parallel / virtual_pipeline split the model on parallel.backend: megatron; this run's backend is {split.backend}")
    own_group = _process_group_for_one(backend, world, accelerator, bf16=use_bf16, offload=cfg.cpu_offload)
    if recipe.weights is not None:
        with parameters_on_meta():
            model = recipe.build_model(ctx, upstream)
    else:
        model = recipe.build_model(ctx, upstream)
    frozen = freeze(model, cfg.freeze, recipe.freeze_groups)
    blocks = recipe.shard_modules(model)
    ckpt_root = ctx.stage_dir / CHECKPOINTS
    plan = _add_adapters(ctx, upstream, recipe, model, blocks, ckpt_root) if cfg.lora.r else None
    if plan is not None:
        frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    apply_recompute(blocks, cfg.recompute)
    if backend is not None:
        model = backend.prepare(model, blocks, device=device, bf16=use_bf16, world=world, offload=cfg.cpu_offload, replicate=ctx.config.parallel.replicate)
    resuming = ctx.resume and newest_complete(ckpt_root) is not None
    if on_meta(model):
        materialise(model, torch.device("cpu") if cfg.cpu_offload else device)
        if not resuming or plan is not None:  # a resume overwrites every weight it trains
            assert recipe.weights is not None
            load_weights(model, recipe.weights(ctx, upstream), distributed=world.distributed, names=_checkpoint_names(plan))
    elif backend is None:
        model = model.to(device)
    if plan is not None and not resuming:
        from mmcore.lora import init_adapters

        init_adapters(model, plan, ctx.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise StageError("every parameter is frozen (training.freeze): nothing to train")
    if world.is_local_main:  # a checkpoint: every weight (LoRA: the trained ones) plus the optimizer's state of the trained ones
        held = params if plan is not None else list(model.parameters())
        checkpoint_bytes = sum(p.numel() * p.element_size() for p in held) + sum((STATE_COPIES[cfg.optimizer] + bool(cfg.ema)) * p.numel() * 4 for p in params)
        previous = RunDir(ctx.run_dir).replaced_dir(ctx.stage)
        hint = f"free disk space, e.g. delete {previous} (the previous finished training, kept until this one finishes)" if previous.exists() else "free disk space or point --run-dir at a larger disk"
        ensure_free_space(ctx.stage_dir, checkpoint_bytes, "a training checkpoint", hint=hint)
        if plan is not None and (warning := lora_size_warning(plan.r, checkpoint_bytes, sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad))):
            ctx.say(warning)
    optimizer = build_optimizer(params, cfg)
    data = recipe.dataset(ctx, upstream)
    sampler = _sampler(ctx, recipe, data)
    planned = planned_steps(cfg, sampler, ctx.say)  # training.steps, or training.epochs of this data
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.lr_schedule, cfg.warmup_steps, planned, cfg.min_lr_ratio))
    keep, files = _lora_checkpoint(model, plan)
    ema = MovingAverage(((n, p) for n, p in model.named_parameters() if p.requires_grad), cfg.ema) if cfg.ema else None
    averaged = ema.state_dict() if ema is not None else None

    step = filled = 0
    last_loss = float("nan")
    resume_from = newest_complete(ckpt_root) if ctx.resume else None
    if resume_from is not None:
        if plan is not None:
            _check_same_adapters(resume_from, plan)
        state = load_checkpoint(resume_from, model, optimizer, scheduler, sampler, world, backend, keep=keep, ema=averaged)
        step = int(state["step"])
        last_loss = float("nan") if state.get("loss") is None else float(state["loss"])
        pointed = (ckpt_root / LATEST).resolve() if (ckpt_root / LATEST).is_symlink() else None
        moved = "" if pointed == resume_from.resolve() else f" ({LATEST} did not point at a complete checkpoint; took the newest complete one, {resume_from.name})"
        ctx.say(f"resumed from step {step}{moved}")
        ctx.resumed_metrics_at(step)
    if recipe.prepare is not None:
        model.eval()
        with torch.no_grad():
            recipe.prepare(ctx, model)
    model.train()

    evals = HeldOutLog(ctx)
    nonfinite = NonFinite(cfg.on_nonfinite, ckpt_root)

    def log_eval(at: int) -> None:
        if recipe.evaluate is None:
            return
        model.eval()
        with torch.no_grad():
            evals.record(at, recipe.evaluate(ctx, model, at))
        model.train()

    if step == 0:
        log_eval(0)
    accelerator.reset_peak_memory()
    history: list[dict[str, float]] = []
    bar = TrainProgress(ctx, step, planned)  # absolute steps, the loss, elapsed and ETA
    for step in bar:
        # ---- step
        t0 = time.perf_counter()
        micro, global_tokens, data_time, spread = step_batches(ctx, recipe, sampler, data, step, device)
        loss_sum = torch.zeros((), device=device)
        flops = 0.0
        for i, batch in enumerate(micro):
            batch = _to_device(batch, device)
            if hasattr(model, "set_requires_gradient_sync"):  # reduce gradients once, after the last micro-batch
                model.set_requires_gradient_sync(i == len(micro) - 1)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16 and not backend_handles_precision(backend, world)):
                loss = recipe.loss(model, batch)
            (loss * (world.world_size / global_tokens)).backward()
            loss_sum += loss.detach().float()
            if recipe.flops is not None:
                flops += recipe.flops(model, batch)
        grad_norm = clip_grad_norm(params, cfg.max_grad_norm)  # model-wide: the same on every rank
        if world.distributed:
            dist.all_reduce(loss_sum)  # before the update: a nan on one rank is every rank's, and all stop or skip alike
        bar.loss = step_loss = loss_sum.item() / global_tokens  # a float already: the progress line costs no sync
        applies = nonfinite.check(step + 1, step_loss, grad_norm)
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
            refuse_nonfinite_checkpoint(params, world, done, ckpt_root, device)
            save_checkpoint(ckpt_root, done, model, optimizer, scheduler, sampler, world, backend, loss=last_loss, keep=keep, files=files, ema=averaged)
        if cfg.eval_every and done % cfg.eval_every == 0 and done < planned:
            log_eval(done)
        crash_point("train-step", done)
    # ---- finish
    final_step = max(planned, step)
    refuse_nonfinite_checkpoint(params, world, final_step, ckpt_root, device)
    save_checkpoint(ckpt_root, final_step, model, optimizer, scheduler, sampler, world, backend, loss=last_loss, keep=keep, files=files, ema=averaged)
    outputs = {"checkpoint": f"{CHECKPOINTS}/{LATEST}"}
    if averaged is not None:
        save_average(ckpt_root / EMA_OUTPUT, model, averaged, world, keep=keep, files=files)  # beside the steps: a LoRA plan's base path holds
        outputs[EMA_OUTPUT] = f"{CHECKPOINTS}/{EMA_OUTPUT}"
    crash_point("train-end", 1)
    log_eval(final_step)
    if world.is_main:
        plot_training(ctx.stage_dir, history, f"{recipe.loss_unit}_per_s")
    notes = [f"final loss {last_loss:.4f} after {final_step} steps" + (f" ({cfg.epochs} epochs)" if cfg.epochs else ""), f"metrics: {ctx.stage_dir / 'metrics.jsonl'}, plot: {ctx.stage_dir / 'train.png'}"]
    result_metrics: dict[str, Any] = {"steps": final_step, "final_loss": last_loss, "frozen_parameters": len(frozen), "bf16": use_bf16,
                                      "sharded": _is_sharded(model), "recompute": cfg.recompute}
    if plan is not None:
        trained = sum(p.numel() for p in params)
        result_metrics["lora"] = {"r": plan.r, "alpha": plan.alpha, "targets": len(plan.targets), "modules_to_save": len(plan.modules_to_save),
                                  "trained_parameters": trained}
        notes.append(f"LoRA r={plan.r} on {len(plan.targets)} layer(s): {trained:,} trained parameters; the base stays as converted")
    notes += sampler_notes(sampler)
    if filled:
        result_metrics["fillers"] = filled
        notes.append(f"{filled} filler(s) kept the ranks' tower calls alike where their micro-batches held different media (this run's steps)")
    if nonfinite.skipped:
        result_metrics["skipped_steps"] = nonfinite.skipped
        notes.append(f"{nonfinite.skipped} step(s) skipped: their loss or gradient norm was not finite (training.on_nonfinite: skip); the final loss is the last finite one")
    evals.summarise(result_metrics, notes)
    if own_group:
        dist.destroy_process_group()
    if averaged is not None:
        result_metrics["ema"] = cfg.ema
        notes.append(f"moving average of the trained weights (decay {cfg.ema}) at {ckpt_root / EMA_OUTPUT}: what export writes (export.weights)")
    return StageResult(outputs=outputs, metrics=result_metrics, notes=notes)


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


def _add_adapters(ctx: StageContext, upstream: Mapping[str, Manifest], recipe: TrainRecipe, model: Any, blocks: list[Any], ckpt_root: Path) -> Any:
    """``training.lora``: plan the adapters against the model and inject them (before sharding)."""
    from mmcore.lora import base_identity, inject, plan_lora, relative_base

    cfg = ctx.config.training
    try:
        import peft  # noqa: F401
    except ImportError:
        raise StageError("training.lora trains adapters through peft, which is not installed here: pip install 'mmcore[lora]'") from None
    if recipe.weights is None:
        raise StageError(f"training.lora: pack {ctx.pack!r} does not load its weights through the engine, so the base of the adapters is unknown")
    path, fingerprint = base_identity(recipe.weights(ctx, upstream), upstream)
    frozen = [g for p in cfg.freeze for g in recipe.freeze_groups.get(p, [p])]
    plan = plan_lora(model, cfg.lora, groups=recipe.freeze_groups, default_targets=recipe.lora_targets, blocks=blocks,
                     frozen=frozen, base=(relative_base(path, ckpt_root), fingerprint))
    inject(model, plan)
    return plan


def _checkpoint_names(plan: Any) -> Callable[[str], str | None]:
    if plan is None:
        return lambda key: key
    from mmcore.lora import base_key

    return base_key


def _lora_checkpoint(model: Any, plan: Any) -> tuple[set[str] | None, dict[str, Any]]:
    """(the model state a checkpoint holds: None for all of it, the plan file it carries)."""
    if plan is None:
        return None, {}
    from dataclasses import asdict

    from mmcore.lora import LORA_FILE, trained_names

    return set(trained_names(model, plan)), {LORA_FILE: asdict(plan)}


def _check_same_adapters(checkpoint: Path, plan: Any) -> None:
    from mmcore.lora import LORA_FILE, LoraPlan

    saved = LoraPlan.read(checkpoint)
    if saved is None:
        raise StageError(f"{checkpoint}: a full fine-tuning checkpoint; this run trains LoRA adapters (training.lora.r={plan.r}): start a new run or set training.lora.r=0")
    if saved.base_fingerprint != plan.base_fingerprint:
        raise StageError(f"{checkpoint / LORA_FILE}: these adapters were trained on another base checkpoint ({saved.base_fingerprint[:12]}, this run's is {plan.base_fingerprint[:12]}): resuming would put them on the wrong weights")
    for name in ("r", "alpha", "targets", "modules_to_save"):
        if getattr(saved, name) != getattr(plan, name):
            raise StageError(f"{checkpoint / LORA_FILE}: saved with another training.lora ({name} differs): start a new run to change the adapters")


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


def _sampler(ctx: StageContext, recipe: TrainRecipe, data: Sequence[Any]) -> Any:
    cfg, world = ctx.config.training, ctx.world
    costs = [recipe.work_of(i) for i in range(len(data))] if recipe.work_of is not None and cfg.balance_towers else None
    if cfg.max_tokens is None:
        groups = [recipe.group_of(i) for i in range(len(data))] if recipe.group_of else None
        return EpochSampler(len(data), ctx.seed, world.rank, world.world_size, cfg.micro_batch_size, groups, costs=costs)
    if not cfg.packing or recipe.length_of is None:
        why = "set training.packing: true" if recipe.length_of is not None else f"pack {ctx.pack!r} does not pack rows"
        raise StageError(f"training.max_tokens fills packed rows to a token budget: {why}")
    if recipe.group_of is not None:
        raise StageError(f"training.max_tokens: pack {ctx.pack!r} keeps kinds of samples in separate micro-batches, which the token-budget sampler does not do yet; use training.micro_batch_size")
    return TokenBudgetSampler([recipe.length_of(i) for i in range(len(data))], cfg.max_tokens, ctx.seed, world.rank, world.world_size, costs=costs)


def _process_group_for_one(backend: Any, world: Any, accelerator: Any, *, bf16: bool, offload: bool) -> bool:
    """A one-process group where the backend shards a single process (its precision and offload
    policies need one); True when this function created it."""
    import torch.distributed as dist

    wants = getattr(backend, "wants_process_group", None)
    if world.distributed or dist.is_initialized() or wants is None or not wants(world, bf16=bf16, offload=offload):
        return False
    dist.init_process_group(accelerator.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def _is_sharded(model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(model, FSDPModule)


def computes_in_bf16(precision: str, accelerator: Any) -> bool:
    """``training.precision``: ``bf16``, or ``auto`` on an accelerator (not the CPU) that has it."""
    return precision == "bf16" or (precision == "auto" and accelerator.device_type != "cpu" and accelerator.supports_bf16())


def backend_handles_precision(backend: Any, world: Any) -> bool:
    return bool(backend is not None and getattr(backend, "handles_precision", lambda w: False)(world))


def step_batches(ctx: StageContext, recipe: TrainRecipe, sampler: Any, data: Sequence[Any], step: int,
                 device: "torch.device") -> tuple[list[dict[str, Any]], float, float, dict[str, float]]:
    """This rank's micro-batches of the step, the step's loss tokens over all ranks, the seconds
    spent reading and collating, and how the step's work spread over the ranks (``tower_balance``,
    ``fillers``).

    One reduction carries the loss tokens, each rank's tower work and which media kinds each
    micro-batch holds; a micro-batch lacking a kind another rank's holds is collated again with
    that kind's filler (:mod:`mmcore.data.fillers`), so every rank calls the same towers.
    """
    import torch
    import torch.distributed as dist

    world = ctx.world
    t0 = time.perf_counter()
    drawn = [sampler.next_batch()[0] for _ in range(ctx.config.training.grad_accum_steps)]
    samples = [[data[i] for i in indices] for indices in drawn]
    micro = [recipe.collate(chosen) for chosen in samples]
    data_time = time.perf_counter() - t0
    held = recipe.fill.presence(drawn) if recipe.fill is not None and world.distributed else []
    work = [0.0] * world.world_size if recipe.work_of is not None and world.distributed else []
    if work:
        work[world.rank] = sum(recipe.work_of(i) for indices in drawn for i in indices)
    counts = torch.tensor([float(sum(b["num_loss_tokens"] for b in micro)), *work, *held], dtype=_count_dtype(device), device=device)
    if world.distributed:
        dist.all_reduce(counts)
    reduced = counts.tolist()
    t1 = time.perf_counter()
    spread: dict[str, float] = {}
    if work:
        spread["tower_balance"] = tower_balance(reduced[1 : 1 + len(work)])
    if held:
        present = reduced[1 + len(work) :]
        spread["fillers"] = filler_count(present, world.world_size)
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


def _to_device(batch: dict[str, Any], device: "torch.device") -> dict[str, Any]:
    import torch

    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


__all__ = ["TrainRecipe", "train_stage", "run_training", "load_converted", "EpochSampler", "lr_lambda", "freeze", "sample_seed"]
