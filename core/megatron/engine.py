"""``parallel.backend: megatron``: the train engine's loop for a family on megatron-core.

The same promises as the FSDP2 loop (:mod:`mmcore.train`), read top to bottom: setup, step,
checkpoint, log. What differs is where the model lives: each process holds one tensor-parallel
shard of one pipeline stage (:class:`MegatronFamily` builds it; the family's table,
:class:`mmcore.parallel_map.ParallelMap`, cuts the converted weights for it), the
micro-batches of a step run through Megatron's forward-backward schedule, and the
*data-parallel* group (processes / (TP x PP)), not the world, drives the sampler, the token
counts and the gradient sum.

Checkpoints are megatron-core's ``dist_checkpointing`` (model and AdamW state, each tensor with
its global shape and offsets), inside the engine's ``checkpoints/step-N`` protocol (written
under ``.incomplete``, renamed when whole, ``latest``, the last two kept) with the scheduler,
the data position and every rank's RNG state: a run resumes exactly, at the same or another
TP/PP. At the end each rank writes its pieces of the trained weights, cut back through the
table, in the family's training names (``checkpoints/trained``, one DCP checkpoint as the FSDP2
loop's: :mod:`mmcore.megatron.trained`), which export reads as it reads any other.

With ``training.lora`` the adapters sit on the language model's layer linears (all, or those
``target_modules`` picks: :func:`lora_kinds`; :mod:`mmcore.megatron.lora`, split over TP as
their base), the rest frozen; the trained
checkpoint holds them merged into the base, ``checkpoints/adapter`` in PEFT's format.

With ``parallel.virtual_pipeline`` = V a rank holds V model chunks (``build`` once per chunk),
chunk v of stage s the (v x PP + s)-th run of layers, run by Megatron's interleaved schedule;
the chunks' checkpoint keys are the layers' global ones, so a run resumes at any V.

Held-out evaluation (``training.eval_every``) runs the family's ``score`` forward only through
the same schedule, each data-parallel replica its share of the samples. Sequence parallelism
is the family's model's (:mod:`mmcore.megatron.gpt`); the loop sums the gradients it leaves
partial (:func:`mmcore.megatron.train.reduce_gradients`).

``training.precision: bf16`` (and ``auto`` on an accelerator with bf16) is the FSDP2 loop's
policy: bf16 compute, fp32 weights, gradient sums and optimizer state
(:class:`mmcore.megatron.precision.Bf16Compute`: the model computes on bf16 copies of its
weights during a step and evaluation). Megatron's own bf16 path, its distributed optimizer,
needs CUDA: ``bench/gpu_megatron.py`` runs it beside this one.

``training.recompute`` wraps each transformer layer of the language model as the FSDP2 loop
wraps a recipe's blocks (:mod:`mmcore.recompute`: full, or selective keeping the matrix
multiplies' outputs).

``training.freeze`` picks the same training names as on FSDP2 (:func:`freeze_rank` maps them
to the Megatron parameters they make up). A frozen tower's features cached by the extract stage
are read as on FSDP2 (``MegatronFamily.use_cache``).

``training.lora`` trains adapters of :mod:`mmcore.megatron.lora` on the layers' linears
(:func:`lora_kinds`), and ``modules_to_save`` whole (:func:`saved_modules`), written in PEFT's
format at the end (:func:`write_adapter`).

``training.ema`` keeps this rank's part of the moving average (:class:`mmcore.ema.MovingAverage`),
checkpointed sharded as the weights (it reshards on resume) and written at the end as they are
(with LoRA, the averaged adapters too: ``ema_adapter``, what export publishes beside the merged
average).

Not on this backend yet (each a one-line error): CPU offload, token-budget packing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from mmcore.checkpointing import CHECKPOINTS, INCOMPLETE, LATEST, TRAINER_STATE, commit_checkpoint, newest_complete, restore_rng, saved_rng, seed_everything
from mmcore.ema import EMA_ADAPTER, EMA_OUTPUT, MovingAverage
from mmcore.errors import StageError
from mmcore.faults import crash_point
from mmcore.guards import NonFinite, refuse_nonfinite_checkpoint
from mmcore.pack import StageResult

if TYPE_CHECKING:
    from mmcore.adapters import StateDictAdapter
    from mmcore.context import StageContext
    from mmcore.parallel_map import ParallelMap
    from mmcore.rundir import Manifest
    from mmcore.train import TrainRecipe

#: what ``training.recompute: selective`` keeps of a megatron-core layer: the linears' outputs; the
#: attention scores and probabilities are recomputed (Megatron's own selective recompute, of
#: the core attention; its local attention also masks the scores in place, which a kept output
#: must not be)
RECOMPUTE_KEPT_OPS = ("mm", "addmm")
TRAINED = "trained"  # checkpoints/trained: the final weights in the family's training names
ADAPTER = "adapter"  # checkpoints/adapter: with training.lora, the adapters in PEFT's format


def _next_token_loss(logits: Any, batch: dict[str, Any]) -> Any:
    from mmcore.causal_lm import next_token_loss_sum

    return next_token_loss_sum(logits, batch["labels"])


@dataclass
class MegatronFamily:
    """What a family gives the megatron backend (its pack's ``megatron.py``).

    Attributes:
        build: ``(layout) -> module``: this rank's part of the model (:class:`Layout`: its TP
            size, pipeline stage and virtual-stage chunk, whether sequence-parallel),
            uninitialised (the engine loads it). Its megatron-core ``GPTModel`` is the
            attribute ``decoder``; on the first (virtual) stage, the modules of ``whole`` are too. It
            follows Megatron's schedule protocol (``config``, ``set_input_tensor``) and returns
            the logits on the last stage.
        parallel_map: the family's table (hub names <-> Megatron names, how each is split).
        adapter: the family's state-dict adapter (hub names <-> training names), to read
            convert's checkpoint and to write the trained one.
        inputs: the batch fields ``build``'s module takes (``labels`` go to ``loss_sum``).
        decoder: the attribute holding the ``GPTModel``; ``decoder_prefix`` its tensors'
            prefix in the table (``"text_decoder."``).
        whole: hub name prefix -> attribute of a module every tensor-parallel rank of the first
            stage holds whole, as transformers has it (a vision tower: ``{"visual.": "visual"}``).
        loss_sum: ``(logits, batch) -> summed loss`` of a micro-batch on the last stage
            (default: next-token cross-entropy over ``batch["labels"]``).
        score: ``(logits, batch) -> {name: (numerator, denominator)}`` of a held-out micro-batch
            on the last stage (``accuracy``: (rows right, rows)); with ``held_out``, logged as
            ``eval/<name>`` = sum of numerators / sum of denominators at step 0, every
            ``training.eval_every`` steps and at the end, as the FSDP2 loop's evaluation.
            ``score_names``: the names it gives (every rank needs them, the last stage alone
            computes them).
        held_out: the held-out samples (``len`` and indexing; the kit's ``eval`` split);
            ``collate_one`` makes one sample a micro-batch.
        use_cache: ``(first chunk of the first stage) -> None``: switch its frozen towers to the
            extract stage's cached features (what the FSDP2 recipe's model gets with a finished
            extract stage; the samples then carry the features). None: the feature cache is refused.
    """

    build: Callable[["Layout"], Any]
    parallel_map: "ParallelMap"
    adapter: "StateDictAdapter"
    inputs: Sequence[str]
    decoder: str = "language_model"
    decoder_prefix: str = "text_decoder."
    whole: Mapping[str, str] = field(default_factory=dict)
    loss_sum: Callable[[Any, dict[str, Any]], Any] = _next_token_loss
    score: Callable[[Any, dict[str, Any]], Mapping[str, tuple[float, float]]] | None = None
    score_names: Sequence[str] = ()
    held_out: Any = None
    collate_one: Callable[[Any], dict[str, Any]] | None = None
    use_cache: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class Layout:
    """Where this process sits: tensor-parallel rank, pipeline stage, data-parallel rank; whether
    the sequence is split over the tensor-parallel ranks between their layers; how many model
    chunks a pipeline rank holds (``virtual``: the interleaved schedule) and which of them a
    module is (``chunk``: what ``MegatronFamily.build`` builds)."""

    tp: int
    pp: int
    dp: int
    tp_rank: int
    stage: int
    dp_rank: int
    sequence_parallel: bool = False
    virtual: int = 1
    chunk: int = 0

    @classmethod
    def current(cls, sequence_parallel: bool = False, virtual: int = 1) -> "Layout":
        from megatron.core import parallel_state as ps

        return cls(ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(), ps.get_data_parallel_world_size(),
                   ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank(), sequence_parallel, virtual)

    def of_chunk(self, chunk: int) -> "Layout":
        return dataclasses.replace(self, chunk=chunk)

    @property
    def virtual_stage(self) -> int:
        """This chunk's place among the PP x V runs of layers (Megatron's interleaved order)."""
        return self.chunk * self.pp + self.stage

    @property
    def rng_stream(self) -> int:
        """Which random stream this rank draws from: one per data-parallel replica and pipeline
        stage, shared by the tensor-parallel ranks (a LoRA dropout mask over an input every TP
        rank holds must be the same on each: :mod:`mmcore.megatron.lora`)."""
        return self.dp_rank + self.dp * self.stage

    def describe(self) -> str:
        return (f"TP={self.tp}{' (sequence-parallel)' if self.sequence_parallel else ''} x PP={self.pp}"
                f"{f' (x {self.virtual} virtual, interleaved)' if self.virtual > 1 else ''} x DP={self.dp}")


class MegatronBackend:
    """The backend object ``parallel.backend: megatron`` names: it owns the training loop."""

    name = "megatron"

    def train(self, ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe") -> StageResult:
        return run_megatron_training(ctx, upstream, recipe)


# --------------------------------------------------------------------------- the loop


def run_megatron_training(ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe") -> StageResult:
    import torch
    import torch.distributed as dist

    from mmcore import megatron
    from mmcore.convert import dcp_index
    from mmcore.megatron.checkpoint import load as load_megatron_checkpoint
    from mmcore.megatron.gpt import init_model_parallel
    from mmcore.megatron.precision import Bf16Compute
    from mmcore.megatron.train import clip_gradients, forward_backward, reduce_gradients, sum_tied_gradients
    from mmcore.optim import build_optimizer, lr_lambda
    from mmcore.plot import plot_training
    from mmcore.recompute import apply_recompute
    from mmcore.sampler import EpochSampler, planned_steps
    from mmcore.train import HeldOutLog, computes_in_bf16, sampler_notes, tower_balance, utilisation
    from mmcore.train_progress import TrainProgress

    cfg, parallel, world, accelerator = ctx.config.training, ctx.config.parallel, ctx.world, ctx.accelerator
    usable, why = megatron.status()
    if not usable:
        raise StageError(f"parallel.backend: megatron: {why}")
    family = _family(ctx, upstream, recipe)
    device = accelerator.device(world.local_rank)
    bf16 = computes_in_bf16(cfg.precision, accelerator)

    # ---- setup: the process groups, this rank's part of the model, its weights
    own_group = False
    if not dist.is_initialized():  # one process: Megatron's groups still need a process group
        dist.init_process_group(accelerator.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
        own_group = True
    init_model_parallel(parallel.tensor_parallel, parallel.pipeline_parallel, seed=ctx.seed, virtual_pipeline=parallel.virtual_pipeline,
                        timeout_s=parallel.collective_timeout_s)
    layout = Layout.current(parallel.sequence_parallel, parallel.virtual_pipeline)
    seed_everything(ctx.seed + layout.rng_stream)
    # this rank's model chunks (one, or one per virtual stage): a ModuleList names them 0, 1, ...
    model = torch.nn.ModuleList([family.build(layout.of_chunk(v)) for v in range(layout.virtual)])
    if "extract" in upstream and layout.stage == 0:  # the samples carry the frozen towers' cached outputs
        family.use_cache(model[0])  # type: ignore[misc]
    decoders = [getattr(chunk, family.decoder) for chunk in model]
    ckpt_root = ctx.stage_dir / CHECKPOINTS
    resume_from = newest_complete(ckpt_root) if ctx.resume else None
    converted = dcp_index(recipe.weights(ctx, upstream))  # type: ignore[misc]  # convert's tensors: training name -> shape
    if resume_from is None:
        for v, chunk in enumerate(model):
            load_rank(chunk, family, recipe.weights(ctx, upstream), layout.of_chunk(v))  # type: ignore[misc]
    frozen = freeze_rank(model, family, layout, recipe.weights(ctx, upstream), cfg.freeze, recipe.freeze_groups) if cfg.freeze else 0  # type: ignore[misc]
    lora = cfg.lora.r > 0
    if lora:  # adapters on the language model's layer linears, the rest frozen (after loading: the base keeps its names)
        from mmcore.megatron.lora import add_adapters, init_adapters

        saved = saved_modules(family, converted, cfg.lora, recipe.freeze_groups)
        whole = chosen_parameters(model, family, layout, converted, saved, "training.lora.modules_to_save", "saved") if saved else []
        model.requires_grad_(False)
        kinds = lora_kinds(family, recipe.weights(ctx, upstream), cfg.lora, recipe.freeze_groups, cfg.freeze)  # type: ignore[misc]
        both = [name for name, _ in whole if name.endswith(".weight") and name.rsplit(".", 2)[-2] in kinds and ".layers." in name]
        if both:
            raise StageError(f"training.lora: {both[0]} is both a LoRA target and in modules_to_save; it can only be one")
        for decoder in decoders:
            add_adapters(decoder, cfg.lora.r, cfg.lora.alpha, targets=kinds, dropout=cfg.lora.dropout)
            init_adapters(decoder, ctx.seed, cfg.lora.init)
        for _, parameter in whole:  # training.lora.modules_to_save: trained whole beside the adapters
            parameter.requires_grad_(True)
        saved_hub = [name for name, made in family.adapter.to_hf(converted).items() if made.sources and set(made.sources) <= saved]
    # training.recompute: each transformer layer of the language model, as the FSDP2 loop's blocks
    apply_recompute([layer for decoder in decoders for layer in decoder.decoder.layers], cfg.recompute, kept_ops=RECOMPUTE_KEPT_OPS)
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    trained = torch.tensor([float(len(params))])  # a stage may train nothing (training.freeze: llm at PP > 1); the run must train something
    dist.all_reduce(trained)
    if not trained.item():
        raise StageError("every parameter is frozen (training.freeze): nothing to train")
    # bf16: each step computes on bf16 copies of the fp32 weights (mmcore.megatron.precision)
    precision = Bf16Compute(model.parameters(), enabled=bf16)
    optimizer = build_optimizer([{"params": params}], cfg)  # a group: it may be empty
    data = recipe.dataset(ctx, upstream)
    groups = [recipe.group_of(i) for i in range(len(data))] if recipe.group_of else None
    costs = [recipe.work_of(i) for i in range(len(data))] if recipe.work_of is not None and cfg.balance_towers else None
    sampler = EpochSampler(len(data), ctx.seed, layout.dp_rank, layout.dp, cfg.micro_batch_size, groups, costs=costs)
    planned = planned_steps(cfg, sampler, ctx.say)  # training.steps, or training.epochs of this data
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.lr_schedule, cfg.warmup_steps, planned, cfg.min_lr_ratio))
    # training.ema: this rank's part of the average, each tensor sharded as its parameter
    ema = MovingAverage(((n, p) for n, p in model.named_parameters() if p.requires_grad), cfg.ema) if cfg.ema else None
    averages = [(ema.parameters[name], average) for name, average in ema.average.items()] if ema is not None else None
    ctx.say(f"megatron-core: {layout.describe()} over {world.world_size} process(es)")

    step = 0
    last_loss = float("nan")
    # the training draws (LoRA dropout) start here, after building and loading drew what they
    # drew (megatron-core's initialisation draws per TP shard): the same at every TP size
    seed_everything(ctx.seed + layout.rng_stream)
    if resume_from is not None:
        state = json.loads((resume_from / TRAINER_STATE).read_text())
        if state.get("backend") != "megatron":
            raise StageError(f"{resume_from}: saved by parallel.backend: {state.get('backend', 'fsdp2')}; resume with that backend, or start a new run")
        if ema is not None and not state.get("ema"):
            raise StageError(f"{resume_from}: saved without a moving average of the weights (training.ema was 0); resume with training.ema=0 or start a new run")
        load_megatron_checkpoint(model, resume_from, optimizer, averages or ())
        scheduler.load_state_dict(state["scheduler"])
        sampler.position = state["sampler_position"]
        step, last_loss = int(state["step"]), float("nan") if state.get("loss") is None else float(state["loss"])
        saved = state.get("layout", {})
        # Megatron's own streams first (reseeding them resets torch's): this rank's where the layout is the saved one
        _restore_megatron_rng(saved_rng(resume_from, world.rank) if saved == _layout_record(layout) else None, ctx.seed + 7919 * step)
        rank = _saved_rank_of(saved, layout)  # the rank whose random stream this one continues
        if rank is None or not restore_rng(resume_from, world, rank):
            seed_everything(ctx.seed + layout.rng_stream + 7919 * step)  # a place the saved layout did not have: a stream of its own
        moved = ("" if (saved.get("tensor_parallel"), saved.get("pipeline_parallel"), saved.get("virtual_pipeline", 1)) == (layout.tp, layout.pp, layout.virtual)
                 else f" (saved at TP={saved.get('tensor_parallel')} x PP={saved.get('pipeline_parallel')}"
                      f"{' x ' + str(saved['virtual_pipeline']) + ' virtual' if saved.get('virtual_pipeline', 1) > 1 else ''}, resharded)")
        ctx.say(f"resumed from step {step}{moved}")
        ctx.resumed_metrics_at(step)
    model.train()
    dp_group = _dp_group()
    shapes = None  # the training model on the meta device: what the recipe counts FLOPs on
    if recipe.flops is not None:
        from mmcore.sharded_load import parameters_on_meta

        with parameters_on_meta():
            shapes = recipe.build_model(ctx, upstream)
    evals = HeldOutLog(ctx)
    nonfinite = NonFinite(cfg.on_nonfinite, ckpt_root)

    def log_eval(at: int) -> None:
        model.eval()
        with precision.step():
            evals.record(at, evaluate_held_out(list(model), family, layout, device))
        model.train()

    if step == 0:
        log_eval(0)
    accelerator.reset_peak_memory()
    history: list[dict[str, float]] = []
    for step in (bar := TrainProgress(ctx, step, planned)):  # absolute steps, the loss, elapsed and ETA
        # ---- step
        t0 = time.perf_counter()
        micro, flops = [], 0.0
        work = [0.0] * layout.dp if recipe.work_of is not None and layout.dp > 1 else []
        for _ in range(cfg.grad_accum_steps):
            indices = sampler.next_batch()[0]
            if work:
                work[layout.dp_rank] += sum(recipe.work_of(i) for i in indices)  # type: ignore[misc]
            batch = recipe.collate([data[i] for i in indices])
            if shapes is not None:
                flops += recipe.flops(shapes, batch)  # type: ignore[misc]
            micro.append({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
                          if k in family.inputs or k in ("labels", "num_loss_tokens")})
        data_time = time.perf_counter() - t0
        counts = torch.tensor([float(sum(b["num_loss_tokens"] for b in micro)), *work], device=device)
        dist.all_reduce(counts, group=dp_group)  # the step's loss tokens, and each data-parallel replica's tower work
        global_tokens = max(counts[0].item(), 1.0)
        with precision.step():
            loss_sum = forward_backward(list(model), micro, family.loss_sum, global_tokens)
        for decoder in decoders:
            sum_tied_gradients(decoder)
        reduce_gradients(params)
        grad_norm = clip_gradients(params, cfg.max_grad_norm)  # over every stage and shard: the same on every rank
        total = torch.tensor([loss_sum], dtype=torch.float64, device=device)
        dist.all_reduce(total, group=dp_group)
        bar.loss = step_loss = total.item() / global_tokens
        # the loss lives on the last pipeline stage only: the stages agree on whether it is finite
        # (one reduction) before any of them updates, stops or skips
        bad = torch.tensor([0.0 if math.isfinite(step_loss) else 1.0], device=device)
        dist.all_reduce(bad)
        seen = step_loss if not bad.item() or not math.isfinite(step_loss) else float("nan")  # another stage's loss was not finite
        applies = nonfinite.check(step + 1, seen, grad_norm)
        if applies:
            optimizer.step()
            last_loss = step_loss
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None and applies:
            ema.update(step + 1)
        elapsed = time.perf_counter() - t0
        done = step + 1
        metrics = {"loss": step_loss, "lr": scheduler.get_last_lr()[0], "grad_norm": grad_norm, f"{recipe.loss_unit}_per_s": global_tokens / elapsed,
                   "step_time_s": elapsed, "data_time_s": data_time, "peak_memory_gb": accelerator.peak_memory_bytes() / 2**30}
        if shapes is not None:  # this replica's FLOPs, shared by its TP x PP processes
            metrics.update(utilisation(flops * layout.dp / world.world_size, elapsed, accelerator))
        if work:
            metrics["tower_balance"] = tower_balance(counts[1:].tolist())
        if nonfinite.skipped:
            metrics["skipped_steps"] = nonfinite.skipped
        history.append({"step": done, **metrics})
        metrics.update({"epoch": sampler.position / sampler.epoch_length()} if cfg.epochs is not None else {})  # passes over the data so far
        if done % cfg.log_every == 0 or done == planned:
            ctx.log_metrics(done, metrics)
        # ---- checkpoint
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < planned:
            refuse_nonfinite_checkpoint(params, world, done, ckpt_root, device, group=dist.group.WORLD)
            save(ckpt_root, done, model, optimizer, scheduler, sampler, world, layout, last_loss, averages)
        if cfg.eval_every and done % cfg.eval_every == 0 and done < planned:
            log_eval(done)
        crash_point("train-step", done)
    # ---- finish: the last checkpoint, then the trained weights in the family's names for export
    final_step = max(planned, step)
    refuse_nonfinite_checkpoint(params, world, final_step, ckpt_root, device, group=dist.group.WORLD)
    save(ckpt_root, final_step, model, optimizer, scheduler, sampler, world, layout, last_loss, averages)
    hub = write_trained(ckpt_root / TRAINED, model, family, layout, world, converted)
    if lora:
        write_adapter(ckpt_root / ADAPTER, model, family, layout, world, cfg.lora, upstream["download"].output("model"), hub, saved_hub, ckpt_root / TRAINED)
    if averages is not None:  # the average written as the weights are, in their place for the while
        with _swapped(averages):
            hub = write_trained(ckpt_root / EMA_OUTPUT, model, family, layout, world, converted)
            if lora:  # the adapters export writes beside the averaged weights
                write_adapter(ckpt_root / EMA_ADAPTER, model, family, layout, world, cfg.lora, upstream["download"].output("model"), hub, saved_hub,
                              ckpt_root / EMA_OUTPUT)
    crash_point("train-end", 1)
    log_eval(final_step)
    if world.is_main:
        plot_training(ctx.stage_dir, history, f"{recipe.loss_unit}_per_s")
    if own_group:
        dist.destroy_process_group()
    metrics: dict[str, Any] = {"steps": final_step, "final_loss": last_loss, "backend": "megatron", **_layout_record(layout), "bf16": bf16, "recompute": cfg.recompute,
                               "frozen_parameters": frozen}
    notes = [f"final loss {last_loss:.4f} after {final_step} steps" + (f" ({cfg.epochs} epochs)" if cfg.epochs else "") + f" on megatron-core ({layout.describe()})",
             f"megatron checkpoint (resumes at any TP/PP): {ckpt_root / LATEST}; trained weights for export: {ckpt_root / TRAINED}",
             f"metrics: {ctx.stage_dir / 'metrics.jsonl'}, plot: {ctx.stage_dir / 'train.png'}", *sampler_notes(sampler)]
    if nonfinite.skipped:
        metrics["skipped_steps"] = nonfinite.skipped
        notes.append(f"{nonfinite.skipped} step(s) skipped: their loss or gradient norm was not finite (training.on_nonfinite: skip); the final loss is the last finite one")
    evals.summarise(metrics, notes)
    if ema is not None:
        metrics["ema"] = cfg.ema
        notes.append(f"moving average of the trained weights (decay {cfg.ema}) at {ckpt_root / EMA_OUTPUT}: what export writes (export.weights)")
    return StageResult(
        outputs={"checkpoint": f"{CHECKPOINTS}/{TRAINED}", "megatron_checkpoint": f"{CHECKPOINTS}/{LATEST}", **({"adapter": f"{CHECKPOINTS}/{ADAPTER}"} if lora else {}),
                 **({EMA_OUTPUT: f"{CHECKPOINTS}/{EMA_OUTPUT}"} if ema is not None else {}),
                 **({EMA_ADAPTER: f"{CHECKPOINTS}/{EMA_ADAPTER}"} if ema is not None and lora else {})},
        metrics=metrics, notes=notes,
    )


def evaluate_held_out(model: Sequence[Any], family: MegatronFamily, layout: Layout, device: Any) -> dict[str, float]:
    """The family's held-out figures (``score`` over ``held_out``, one sample a micro-batch,
    forward only): each data-parallel replica takes every DP-th sample, all its TP x PP ranks
    the same ones; empty without a score or held-out samples."""
    import torch

    from mmcore.megatron.train import forward_scores

    if family.score is None or not family.score_names or family.held_out is None or family.collate_one is None or len(family.held_out) == 0:
        return {}
    collate_one = family.collate_one
    batches = []
    for i in range(layout.dp_rank, len(family.held_out), layout.dp):
        batch = collate_one(family.held_out[i])
        batches.append({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items() if k in family.inputs or k == "labels"})
    sums = forward_scores(model, batches, family.score, family.score_names)
    return {name: numerator / denominator for name, (numerator, denominator) in sums.items() if denominator}


def _family(ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe") -> MegatronFamily:
    """The recipe's megatron part, after refusing what this backend does not do yet."""
    cfg, parallel = ctx.config.training, ctx.config.parallel
    if recipe.megatron is None:
        raise StageError(f"parallel.backend: megatron: the {ctx.pack} pack does not run on megatron-core" + (" for training.method: dpo" if cfg.method == "dpo" else ""))
    from mmcore.preflight import megatron_layout_problem

    problem = megatron_layout_problem(parallel, cfg, ctx.world.world_size)  # the launcher checked it too; a run started another way
    if problem:
        raise StageError(problem)
    refused = {
        "training.cpu_offload": bool(cfg.cpu_offload),
        "training.max_tokens / training.packing": cfg.max_tokens is not None or bool(cfg.packing),
    }
    for what, asked in refused.items():
        if asked:
            raise StageError(f"parallel.backend: megatron does not support {what} yet")
    if recipe.weights is None:
        raise StageError(f"parallel.backend: megatron: the {ctx.pack} pack does not load its weights through the engine")
    family = recipe.megatron(ctx, upstream)
    if "extract" in upstream and family.use_cache is None:
        raise StageError(f"parallel.backend: megatron: the {ctx.pack} pack does not read the extract stage's feature cache on megatron yet (set extract.enabled=false)")
    return family


def _saved_rank_of(saved: Mapping[str, Any], layout: Layout) -> int | None:
    """The rank of a checkpoint saved at layout ``saved`` (its ``_layout_record``) whose random
    stream this rank continues: the first tensor-parallel rank of the same data-parallel replica
    and pipeline stage (megatron-core numbers ranks TP fastest, then DP, then PP), when the
    pipeline is split as it was and that replica existed; else None."""
    tp, pp, dp = saved.get("tensor_parallel"), saved.get("pipeline_parallel"), saved.get("data_parallel")
    if tp is None or dp is None or pp != layout.pp or layout.dp_rank >= dp:
        return None
    return int(tp) * (layout.dp_rank + int(dp) * layout.stage)


def _layout_record(layout: Layout) -> dict[str, int | bool]:
    return {"tensor_parallel": layout.tp, "pipeline_parallel": layout.pp, "data_parallel": layout.dp, "sequence_parallel": layout.sequence_parallel,
            "virtual_pipeline": layout.virtual}


def _dp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


# --------------------------------------------------------------------------- weights in and out


def _stage_layers(family: MegatronFamily, megatron_names: Mapping[str, Any], pp: int) -> dict[str, list[int]]:
    """Layers per stage of each of the table's stacks: the decoder's as even as they go (as
    ``build`` places them, :func:`mmcore.parallel_map.even_layers`), none of any other."""
    from mmcore.parallel_map import even_layers

    pmap = family.parallel_map
    return {stack.prefix: even_layers(pmap.layer_count(megatron_names, stack), pp) if stack.prefix.startswith(family.decoder_prefix) else [0] * pp
            for stack in pmap.stacks}


def rank_sources(family: MegatronFamily, hub_names: Sequence[str], layout: Layout) -> tuple[dict[str, tuple[Any, tuple[str, ...]]], list[str]]:
    """From the names alone: this rank's decoder tensors (its stage's local Megatron names ->
    (the table's rule, the hub tensors fused into it)) and the hub tensors of the ``whole``
    modules it holds (on the first stage), so a rank reads only its stage's part. With
    virtual stages, the part of the chunk ``layout.chunk``."""
    pmap = family.parallel_map
    plan = {name: made for name, made in pmap.plan(hub_names).items() if name.startswith(family.decoder_prefix)}
    local = {name: name for name in plan}  # split_pp only moves values: here, each tensor's global name
    stages = layout.pp * layout.virtual  # virtual stages: chunk v of stage s is the (v x PP + s)-th
    if stages > 1:
        local = pmap.split_pp(local, _stage_layers(family, local, stages))[layout.virtual_stage]
    whole = [name for name in hub_names if layout.virtual_stage == 0 and name.startswith(tuple(family.whole))]
    return {name: plan[global_name] for name, global_name in local.items()}, whole


def freeze_rank(model: Sequence[Any], family: MegatronFamily, layout: Layout, checkpoint: Path, patterns: Sequence[str],
                groups: Mapping[str, Sequence[str]]) -> int:
    """``training.freeze`` on this rank's model chunks: the patterns (globs, the recipe's groups)
    pick training names of convert's checkpoint, as on FSDP2; a Megatron parameter is frozen
    when every tensor it is made of is (through the family's adapter and table), and one made
    of frozen and trained tensors (a fused QKV with only q frozen) is a one-line error, as is
    a layer's tensor frozen in some layers only. Returns how many training names are frozen
    (the FSDP2 loop's count)."""
    from mmcore.convert import dcp_index
    from mmcore.optim import frozen_names

    index = dcp_index(checkpoint)
    frozen = set(frozen_names(list(index), patterns, groups))
    for _, parameter in chosen_parameters(model, family, layout, index, frozen, "training.freeze", "frozen"):
        parameter.requires_grad_(False)
    return len(frozen)


def chosen_parameters(model: Sequence[Any], family: MegatronFamily, layout: Layout, index: Mapping[str, Any], chosen: set[str], setting: str,
                      does: str) -> list[tuple[str, Any]]:
    """This rank's Megatron parameters (global names) made only of the ``chosen`` training names
    (through the family's adapter and table; the vision tower's by name, a tied output layer's
    copy as the embedding). One made of chosen and other tensors (a fused QKV with only q
    chosen), or a layer's tensor chosen in some layers only, is a one-line error naming
    ``setting`` (what it ``does``)."""
    to_hub = family.adapter.to_hf(index)  # hub name -> the training names it is made of
    pmap = family.parallel_map
    plan = pmap.plan(list(to_hub))  # global Megatron name -> (rule, the hub tensors it is made of)
    _same_in_every_layer(family, {name: {s for part in parts for s in to_hub[part].sources} <= chosen
                                  for name, (_, parts) in plan.items() if name.startswith(family.decoder_prefix)}, setting, does)
    # a tied output layer's copy (the last stage's) is made of what the embedding is
    tied = {pmap.tied[0]: plan[pmap.tied[1]][1]} if pmap.tied and pmap.tied[1] in plan else {}
    found = []
    for v, chunk in enumerate(model):
        mine, _ = rank_sources(family, list(to_hub), layout.of_chunk(v))
        made_of: dict[str, tuple[Any, tuple[str, ...]]] = {}
        for name, parameter in getattr(chunk, family.decoder).named_parameters():
            full = family.decoder_prefix + name
            made_of[full] = (parameter, mine[full][1] if full in mine else tied.get(full, ()))
        for prefix, attribute in family.whole.items():
            module = getattr(chunk, attribute, None) if layout.of_chunk(v).virtual_stage == 0 else None
            for name, parameter in (module.named_parameters() if module is not None else ()):
                made_of[prefix + name] = (parameter, (prefix + name,))
        for name, (parameter, hub) in made_of.items():
            sources = {source for part in hub for source in to_hub[part].sources}
            if sources and sources <= chosen:
                found.append((name, parameter))
            elif sources & chosen:
                raise StageError(f"{setting}: {sorted(sources & chosen)[0]} is {does} but not {sorted(sources - chosen)[0]}; "
                                 f"on parallel.backend: megatron they are one tensor ({name}): all of them or none")
    return found


def saved_modules(family: MegatronFamily, index: Mapping[str, Any], lora: Any, groups: Mapping[str, Sequence[str]]) -> set[str]:
    """``training.lora.modules_to_save``: the training names of the modules its globs and the
    recipe's groups pick (a module holding parameters itself, as on FSDP2)."""
    from mmcore.lora import expand_groups, matches_any

    saved: set[str] = set()
    for entry, globs in expand_groups(lora.modules_to_save, groups):
        hit = {name for name in index if matches_any(name.rsplit(".", 1)[0], globs)}
        if not hit:
            raise StageError(f"training.lora.modules_to_save: {entry!r} matches no module with parameters")
        saved |= hit
    return saved


def _same_in_every_layer(family: MegatronFamily, chosen: Mapping[str, bool], setting: str = "training.freeze", does: str = "frozen") -> None:
    """megatron-core checkpoints a decoder layer's tensor of one kind in all layers as one
    tensor (layers stacked), with the optimizer's state beside it: a kind frozen (or adapted) in
    some layers and not in others would leave holes in that state. ``chosen``: global Megatron
    name -> whether ``setting`` chose it (``does``: what it does to it, for the message)."""
    import re

    kinds: dict[str, dict[bool, str]] = {}
    for name, is_chosen in chosen.items():
        if re.search(r"\.layers\.\d+\.", name):
            kinds.setdefault(re.sub(r"\.layers\.\d+\.", ".layers.N.", name), {})[is_chosen] = name
    for kind, seen in kinds.items():
        if len(seen) == 2:
            raise StageError(f"{setting}: {seen[True]} is {does} but not {seen[False]}: on parallel.backend: megatron a layer's tensor is {does} in "
                             f"every layer or in none (megatron-core checkpoints {kind} of all layers as one tensor)")


def lora_kinds(family: MegatronFamily, checkpoint: Path, lora: Any, groups: Mapping[str, Sequence[str]], freeze: Sequence[str]) -> tuple[str, ...]:
    """``training.lora.target_modules`` on megatron: which of a decoder layer's linears
    (:data:`mmcore.megatron.lora.DEFAULT_TARGETS`) get adapters. The globs and the recipe's
    groups pick training modules (a weight's name less ``.weight``) as on FSDP2, less what
    ``training.freeze`` freezes; through the family's adapter and table they must make up whole
    layer linears (q, k and v are one linear; gate and up one), the same in every layer, and
    nothing outside them (the embedding, the output layer, the vision tower). Empty
    ``target_modules``: every layer linear, as FSDP2's default (the language model's blocks)."""
    import re

    from mmcore.convert import dcp_index
    from mmcore.lora import expand_groups, matches_any
    from mmcore.megatron.lora import DEFAULT_TARGETS
    from mmcore.optim import frozen_names

    if not lora.target_modules:
        return DEFAULT_TARGETS
    index = dcp_index(checkpoint)
    to_hub = family.adapter.to_hf(index)  # hub name -> the training names it is made of
    frozen = set(frozen_names(list(index), freeze, groups)) if freeze else set()
    weights = {name.removesuffix(".weight"): name for name, info in index.items() if name.endswith(".weight") and len(info.shape) >= 2}
    targeted: set[str] = set()
    for entry, globs in expand_groups(lora.target_modules, groups):
        hit = [weights[module] for module in weights if matches_any(module, globs)]
        if not hit:
            raise StageError(f"training.lora.target_modules: {entry!r} matches no linear or embedding layer and is no group (groups: {', '.join(groups) or 'none'})")
        targeted.update(name for name in hit if name not in frozen)
    adapted: dict[str, bool] = {}
    covered: set[str] = set()
    for name, (_, parts) in family.parallel_map.plan(list(to_hub)).items():
        kind = name.rsplit(".", 2)[-2]
        if not (name.startswith(family.decoder_prefix) and name.endswith(".weight") and re.search(r"\.layers\.\d+\.", name) and kind in DEFAULT_TARGETS):
            continue
        sources = {source for part in parts for source in to_hub[part].sources}
        covered |= sources
        if sources & targeted and not sources <= targeted:
            raise StageError(f"training.lora.target_modules adapts {sorted(sources & targeted)[0].removesuffix('.weight')} but not {sorted(sources - targeted)[0].removesuffix('.weight')}; "
                             f"on parallel.backend: megatron they are one linear ({name.removeprefix(family.decoder_prefix)}): adapt all of them or none")
        adapted[name] = bool(sources) and sources <= targeted
    outside = sorted(targeted - covered)
    if outside:
        raise StageError(f"training.lora.target_modules: {outside[0].removesuffix('.weight')} is not a linear of the language model's layers; "
                         "LoRA on parallel.backend: megatron adapts only those (parallel.backend: fsdp2 adapts any linear or embedding)")
    _same_in_every_layer(family, adapted, "training.lora.target_modules", "adapted")
    kinds = tuple(kind for kind in DEFAULT_TARGETS if any(adapted[name] for name in adapted if name.rsplit(".", 2)[-2] == kind))
    if not kinds:
        raise StageError("training.lora: no layer to adapt (every target is frozen by training.freeze)")
    return kinds


def load_rank(model: Any, family: MegatronFamily, checkpoint: Path, layout: Layout) -> None:
    """Fill this rank's ``model`` from convert's checkpoint (training names, DCP) by
    :func:`fill_rank`: only the tensors this stage is made of are read, one layer at a time."""
    from mmcore.adapters import materialize
    from mmcore.convert import dcp_index, load_dcp_tensors, read_whole_tensor, whole_tensor_files

    index = dcp_index(checkpoint)
    to_hub = family.adapter.to_hf(index)  # hub name -> how to make it from training names
    mapped = whole_tensor_files(checkpoint)  # as convert writes them: each tensor alone in a file

    def read(hub_names: set[str]) -> dict[str, Any]:
        # a mapped tensor's pages are read as the rank's slice is copied out (Rule.shard): a
        # rank reads about its part; DCP's reader would decode each tensor whole beside its bytes
        sources = {source for name in hub_names for source in to_hub[name].sources}
        tensors = {name: read_whole_tensor(mapped[name], index[name]) for name in sources if name in mapped}
        if sources - set(tensors):
            tensors.update(load_dcp_tensors(checkpoint, sources - set(tensors), index))
        return {name: materialize(to_hub[name], tensors.__getitem__) for name in hub_names}

    fill_rank(model, family, layout, list(to_hub), read)


def fill_rank(model: Any, family: MegatronFamily, layout: Layout, hub_names: Sequence[str], read: Callable[[set[str]], Mapping[str, Any]]) -> None:
    """Fill this rank's ``model`` from hub-named tensors (``read(names) -> {name: tensor}``, any
    storage): the decoder's tensor-parallel shard of this stage, cut by the table, and the
    ``whole`` modules on the first stage. One layer is read at a time: a rank holds its shard
    plus one layer's whole tensors (host memory ~ model / (TP x PP) + a layer)."""
    from mmcore.megatron.gpt import check_rank_names, copy_rank_state

    mine, whole = rank_sources(family, hub_names, layout)
    decoder = getattr(model, family.decoder)
    check_rank_names(decoder, list(mine), family.decoder_prefix)
    for group in _by_layer(mine):
        hub = read({part for name in group for part in mine[name][1]})
        copy_rank_state(decoder, {name: rule.shard([hub[part] for part in parts], layout.tp, layout.tp_rank)
                                  for name, (rule, parts) in ((name, mine[name]) for name in group)}, family.decoder_prefix)
    if layout.virtual_stage == 0 and whole:
        for prefix, attribute in family.whole.items():
            module, names = getattr(model, attribute), [name for name in whole if name.startswith(prefix)]
            check_rank_names(module, names, prefix)
            for group in _by_layer(names):  # a block at a time, as the decoder's layers
                copy_rank_state(module, read(set(group)), prefix)


def _by_layer(names: Iterable[str]) -> list[list[str]]:
    """Names grouped by the numbered layer or block they belong to (``...layers.N.``,
    ``...blocks.N.``: up to the first number in the name); every other tensor (embedding,
    final norm, output layer) a group of its own."""
    import re

    groups: dict[str, list[str]] = {}
    for name in names:
        found = re.match(r"^.*?\.\d+\.", name)
        groups.setdefault(found.group(0) if found else name, []).append(name)
    return list(groups.values())


def gather_hub_state(model: Sequence[Any], family: MegatronFamily, layout: Layout) -> dict[str, Any] | None:
    """The whole model as hub-named tensors on global rank 0 (None elsewhere): every rank of
    data-parallel replica 0 sends its chunks' shards there, where the table merges them (LoRA
    adapters merged into their base weights first). Holds the whole model in rank 0's memory
    (as an export does)."""
    from mmcore.megatron.lora import merged_state

    def part(chunk: int) -> tuple[dict[str, Any], dict[str, Any]]:
        decoder = {family.decoder_prefix + k: v.cpu() for k, v in merged_state(getattr(model[chunk], family.decoder)).items()}
        whole = {}
        if layout.of_chunk(chunk).virtual_stage == 0 and layout.tp_rank == 0:
            whole = {prefix + k: v.detach().cpu() for prefix, attribute in family.whole.items() for k, v in getattr(model[chunk], attribute).state_dict().items()}
        return decoder, whole

    stages = _gather_by_stage(layout, part)
    if stages is None:
        return None
    pmap = family.parallel_map
    merged = [pmap.merge_tp([decoder for decoder, _ in ranks]) for ranks in stages]
    hub = pmap.to_hf(pmap.merge_pp(merged) if len(merged) > 1 else merged[0])
    for ranks in stages:
        for _, whole in ranks:
            hub.update(whole)
    return hub


def _gather_by_stage(layout: Layout, part: Callable[[int], Any]) -> list[list[Any]] | None:
    """``part(chunk)`` of every chunk of every rank of data-parallel replica 0, on global rank 0:
    one list per (virtual) pipeline stage in the model's order, in tensor-parallel rank order
    (None on the other ranks)."""
    import torch.distributed as dist

    mine = (layout.stage, layout.tp_rank, [part(v) for v in range(layout.virtual)]) if layout.dp_rank == 0 else None
    parts: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(mine, parts if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return None
    received = sorted((p for p in parts if p is not None), key=lambda p: (p[0], p[1]))
    return [[chunks[v] for stage, _, chunks in received if stage == s] for v in range(layout.virtual) for s in range(layout.pp)]


def write_trained(folder: Path, model: Sequence[Any], family: MegatronFamily, layout: Layout, world: Any,
                  index: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The trained weights in the family's training names as a DCP model checkpoint
    (``model.<name>``: what export and :func:`mmcore.checkpointing.load_converted` read),
    replacing ``folder`` only once complete. With ``index`` (convert's tensors: training name
    -> shape, the whole shapes) and an adapter that only renames, every rank writes its own
    pieces (:mod:`mmcore.megatron.trained`: no rank holds more than its part) and None is
    returned. Otherwise (an adapter that combines tensors; callers of SDK < 1.15) the model is
    gathered on rank 0, which must hold it whole, and gets it back under hub names."""
    import os

    import torch.distributed as dist

    from mmcore.io import fsync_dir
    from mmcore.megatron.trained import rank_pieces, renames_only, write_pieces

    to_hub = family.adapter.to_hf(dict(index)) if index is not None else None
    partial = folder.with_name(folder.name + INCOMPLETE)
    if world.is_local_main:  # as commit_checkpoint: each node's local rank 0, each step tolerating another node's having done it
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
    if world.distributed:
        dist.barrier()
    hub = None
    if index is not None and to_hub is not None and renames_only(to_hub):
        write_pieces(partial, rank_pieces(model, family, layout, to_hub), {name: info.shape for name, info in index.items()})
    else:
        hub = _write_gathered(partial, model, family, layout)
    if world.distributed:
        dist.barrier()
    if world.is_local_main:
        with contextlib.suppress(FileNotFoundError):  # another node on the same file system moved it already
            os.replace(partial, folder)
        fsync_dir(folder.parent)
    if world.distributed:
        dist.barrier()
    return hub


def _write_gathered(partial: Path, model: Sequence[Any], family: MegatronFamily, layout: Layout) -> dict[str, Any] | None:
    """The trained weights through rank 0, for an adapter that combines tensors (a piece of a
    hub tensor is then no piece of a training tensor): :func:`gather_hub_state`, converted;
    the hub tensors on rank 0 (None elsewhere)."""
    import torch.distributed.checkpoint as dcp

    from mmcore.adapters import TensorInfo, materialize

    hub = gather_hub_state(model, family, layout)
    if hub is not None:
        plan = family.adapter.to_mm({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in hub.items()})
        state = {name: materialize(recipe, hub.__getitem__).contiguous() for name, recipe in plan.items()}
        dcp.save({"model": state}, checkpoint_id=str(partial), no_dist=True)
    return hub


def write_adapter(folder: Path, model: Sequence[Any], family: MegatronFamily, layout: Layout, world: Any, lora: Any, base_model: Path,
                  hub: Mapping[str, Any] | None = None, saved: Sequence[str] = (), trained: Path | None = None) -> None:
    """The LoRA adapters in PEFT's format (``PeftModel.from_pretrained`` on the base model loads
    them): every tensor-parallel rank's shards of every stage, merged by the table on rank 0;
    with ``saved`` (the hub names of ``modules_to_save``'s tensors), their trained tensors
    whole, from ``hub`` (what a gathering :func:`write_trained` returned) or read from
    ``trained`` (its checkpoint), a tied output layer's beside the embedding's."""
    import torch.distributed as dist

    from mmcore.megatron.lora import adapter_shards, peft_state, write_peft

    def part(chunk: int) -> dict[str, Any]:
        shards = adapter_shards(getattr(model[chunk], family.decoder), prefix=family.decoder_prefix)
        return {name: (a.cpu(), b.cpu()) for name, (a, b) in shards.items()}

    stages = _gather_by_stage(layout, part)
    if stages is not None:
        tensors: dict[str, Any] = {}
        for ranks in stages:
            tensors.update(peft_state(family.parallel_map, ranks, family.adapter.model_name))
        modules = []
        if saved and hub is None and trained is not None:
            hub = _read_hub(trained, family, saved)
        if saved and hub is not None:
            names = [name for name in saved if name in hub]
            pmap = family.parallel_map
            if pmap.tied and any(name in names for name in pmap.rule_of(pmap.tied[1]).hf):  # peft saves a tied partner too
                names += [name for name in pmap.rule_of(pmap.tied[0]).hf if name not in hub and name not in names]
                hub = {**hub, **{name: hub[pmap.rule_of(pmap.tied[1]).hf[0]] for name in pmap.rule_of(pmap.tied[0]).hf if name not in hub}}
            for name in names:
                module = family.adapter.model_name(name)
                tensors[f"base_model.model.{module}"] = hub[name].clone()
                modules.append(module.rsplit(".", 1)[0])
        shutil.rmtree(folder, ignore_errors=True)
        write_peft(folder, tensors, lora.r, lora.alpha, base_model, lora.dropout, sorted(set(modules)))
    if world.distributed:
        dist.barrier()


def _read_hub(trained: Path, family: MegatronFamily, names: Sequence[str]) -> dict[str, Any]:
    """The hub tensors ``names`` (those the checkpoint has) read whole from a trained checkpoint."""
    from mmcore.adapters import materialize
    from mmcore.convert import dcp_index, load_dcp_tensors

    index = dcp_index(trained)
    plan = {name: recipe for name, recipe in family.adapter.to_hf(index).items() if name in set(names)}
    tensors = load_dcp_tensors(trained, {source for recipe in plan.values() for source in recipe.sources}, index)
    return {name: materialize(recipe, tensors.__getitem__) for name, recipe in plan.items()}


def save(root: Path, step: int, model: Any, optimizer: Any, scheduler: Any, sampler: Any, world: Any, layout: Layout, loss: float,
         averages: Sequence[tuple[Any, Any]] | None = None) -> None:
    """``root/step-N``: the model, optimizer and moving average (``averages``: parameter and
    average pairs, none on a rank that trains nothing; None without training.ema) in megatron-core's ``dist_checkpointing``, with the scheduler, data
    position, layout and RNG states, by the engine's protocol."""
    from mmcore.megatron.checkpoint import save as save_megatron_checkpoint

    trainer_state = {"step": step, "loss": loss, "scheduler": scheduler.state_dict(), "sampler_position": sampler.position,
                     "backend": "megatron", "layout": _layout_record(layout), "ema": averages is not None}
    commit_checkpoint(root, step, world, lambda partial: save_megatron_checkpoint(model, partial, optimizer, averages=averages or ()), trainer_state,
                      more_rng=_megatron_rng)


#: the RNG checkpoint's entry for Megatron's named random states
MEGATRON_RNG = "megatron_rng_tracker"


def _megatron_rng() -> dict[str, Any]:
    """Megatron's named random states (its RNG tracker): under sequence parallelism its
    transformer block draws everything, LoRA's dropout masks included, from the
    model-parallel one, which a resume must continue as torch's own."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {MEGATRON_RNG: {name: state.tolist() for name, state in get_cuda_rng_tracker().get_states().items()}}


def _restore_megatron_rng(saved: Mapping[str, Any] | None, fresh_seed: int) -> None:
    """Megatron's named random states as this rank ``saved`` them (the model-parallel one is
    each tensor-parallel rank's own, so only the same rank at the same layout continues it),
    else fresh ones from ``fresh_seed``. Either way torch's own state is to be set after."""
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    if saved is not None and MEGATRON_RNG in saved:
        get_cuda_rng_tracker().set_states({name: torch.tensor(state, dtype=torch.uint8) for name, state in saved[MEGATRON_RNG].items()})
    else:
        model_parallel_cuda_manual_seed(fresh_seed)


@contextlib.contextmanager
def _swapped(averages: Sequence[tuple[Any, Any]]) -> Iterator[None]:
    """Each parameter holds its average (and the average its weights) for the while."""
    def swap() -> None:
        for parameter, average in averages:
            weights = parameter.data
            parameter.data = average.data
            average.data = weights

    swap()
    try:
        yield
    finally:
        swap()


__all__ = ["MegatronFamily", "MegatronBackend", "Layout", "TRAINED", "ADAPTER", "write_adapter", "run_megatron_training", "rank_sources", "load_rank", "fill_rank", "gather_hub_state", "write_trained"]
