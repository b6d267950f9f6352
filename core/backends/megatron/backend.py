"""The megatron-core backend (``parallel.backend: megatron``) as the train loop drives it
(:class:`mmcore.backends.protocol.Backend`); :mod:`mmcore.backends.megatron.engine` says what it does and why.

Each process holds one tensor-parallel shard of one pipeline stage (one chunk per virtual
stage); the micro-batches of a step run through Megatron's forward-backward schedule; the
*data-parallel* group (processes / (TP x PP x CP)), not the world, drives the sampler and the
token counts; the gradient and loss sums take the context-parallel ranks too (each holds part of
every sample's tokens: :mod:`mmcore.backends.megatron.context`). Checkpoints are megatron-core's ``dist_checkpointing`` inside the
engine's ``checkpoints/step-N`` protocol; at the end the trained weights (and with LoRA the
adapters; with ``training.ema`` their averages) are written in the family's training names.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from mmcore.backends.protocol import Finished, Prepared, Resumed
from mmcore.checkpoint.training import CHECKPOINTS, LATEST, TRAINER_STATE, commit_checkpoint, restore_rng, saved_rng, seed_everything
from mmcore.train.ema import EMA_ADAPTER, EMA_OUTPUT
from mmcore.errors import StageError
from mmcore.backends.megatron.family import ADAPTER, RECOMPUTE_KEPT_OPS, TRAINED, Layout, MegatronFamily, MegatronRecipe
from mmcore.backends.megatron.weights import chosen_parameters, freeze_rank, load_rank, lora_kinds, saved_modules
from mmcore.backends.megatron.write import write_adapter, write_trained

if TYPE_CHECKING:
    from mmcore.framework.context import StageContext
    from mmcore.train.ema import MovingAverage
    from mmcore.run.rundir import Manifest
    from mmcore.train import TrainRecipe


class MegatronBackend:
    """The backend object ``parallel.backend: megatron`` names."""

    name = "megatron"

    # ---- setup: the process groups, this rank's part of the model, its weights

    def setup(self, ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe", resume_from: Path | None) -> Prepared:
        import torch
        import torch.distributed as dist

        from mmcore import megatron
        from mmcore.engines.convert import dcp_index
        from mmcore.backends.megatron.gpt import init_model_parallel
        from mmcore.backends.megatron.precision import Bf16Compute
        from mmcore.train.recompute import apply_recompute
        from mmcore.train import computes_in_bf16

        cfg, parallel, world, accelerator = ctx.config.training, ctx.config.parallel, ctx.world, ctx.accelerator
        usable, why = megatron.status()
        if not usable:
            raise StageError(f"parallel.backend: megatron: {why}")
        self.ctx, self.upstream, self.recipe, self.world = ctx, upstream, recipe, world
        self.family = family = _family(ctx, upstream, recipe)
        self.device = accelerator.device(world.local_rank)
        bf16 = computes_in_bf16(cfg.precision, accelerator)
        self.own_group = not dist.is_initialized()
        if self.own_group:  # one process: Megatron's groups still need a process group
            dist.init_process_group(accelerator.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
        init_model_parallel(
            parallel.tensor_parallel,
            parallel.pipeline_parallel,
            seed=ctx.seed,
            virtual_pipeline=parallel.virtual_pipeline,
            timeout_s=parallel.collective_timeout_s,
            context_parallel=parallel.context_parallel,
        )
        self.layout = layout = Layout.current(parallel.sequence_parallel, parallel.virtual_pipeline)
        seed_everything(ctx.seed + layout.rng_stream)
        # this rank's model chunks (one, or one per virtual stage): a ModuleList names them 0, 1, ...
        self.model = model = torch.nn.ModuleList([family.build(layout.of_chunk(v)) for v in range(layout.virtual)])
        if "extract" in upstream and layout.stage == 0:  # the samples carry the frozen towers' cached outputs
            family.use_cache(model[0])  # type: ignore[misc]
        self.decoders = decoders = [getattr(chunk, family.decoder) for chunk in model]
        weights = recipe.weights(ctx, upstream)  # type: ignore[misc]
        self.converted = converted = dcp_index(weights)  # convert's tensors: training name -> shape
        if resume_from is None:
            for v, chunk in enumerate(model):
                load_rank(chunk, family, weights, layout.of_chunk(v))
        frozen = freeze_rank(model, family, layout, weights, cfg.freeze, recipe.freeze_groups) if cfg.freeze else 0
        self.lora, self.saved_hub = cfg.lora.r > 0, []
        if self.lora:  # adapters on the language model's layer linears, the rest frozen (after loading: the base keeps its names)
            from mmcore.backends.megatron.lora import add_adapters, init_adapters

            saved = saved_modules(family, converted, cfg.lora, recipe.freeze_groups)
            whole = chosen_parameters(model, family, layout, converted, saved, "training.lora.modules_to_save", "saved") if saved else []
            model.requires_grad_(False)
            kinds = lora_kinds(family, weights, cfg.lora, recipe.freeze_groups, cfg.freeze)
            both = [name for name, _ in whole if name.endswith(".weight") and name.rsplit(".", 2)[-2] in kinds and ".layers." in name]
            if both:
                raise StageError(f"training.lora: {both[0]} is both a LoRA target and in modules_to_save; it can only be one")
            for decoder in decoders:
                add_adapters(decoder, cfg.lora.r, cfg.lora.alpha, targets=kinds, dropout=cfg.lora.dropout)
                init_adapters(decoder, ctx.seed, cfg.lora.init)
            for _, parameter in whole:  # training.lora.modules_to_save: trained whole beside the adapters
                parameter.requires_grad_(True)
            self.saved_hub = [name for name, made in family.adapter.to_hf(converted).items() if made.sources and set(made.sources) <= saved]
        # training.recompute: each transformer layer of the language model, as the FSDP2 loop's blocks
        apply_recompute([layer for decoder in decoders for layer in decoder.decoder.layers], cfg.recompute, kept_ops=RECOMPUTE_KEPT_OPS)
        model.to(self.device)
        self.params = params = [p for p in model.parameters() if p.requires_grad]
        trained = torch.tensor([float(len(params))])  # a stage may train nothing (training.freeze: llm at PP > 1); the run must train something
        dist.all_reduce(trained)
        if not trained.item():
            raise StageError("every parameter is frozen (training.freeze): nothing to train")
        # bf16: each step computes on bf16 copies of the fp32 weights (mmcore.backends.megatron.precision)
        self.precision = Bf16Compute(model.parameters(), enabled=bf16)
        self.dp_group = _dp_group()
        return Prepared(
            model=model,
            trained=params,
            optimizer_params=[{"params": params}],
            frozen=frozen,
            bf16=bf16,  # a group: it may be empty
            data_rank=layout.dp_rank,
            data_ranks=layout.dp,
            data_group=self.dp_group,
            fills=False,
            finite_group=dist.group.WORLD,
        )

    def start(self, checkpoint: Path | None, optimizer: Any, scheduler: Any, sampler: Any, ema: "MovingAverage | None") -> Resumed | None:
        from mmcore.backends.megatron.checkpoint import load as load_megatron_checkpoint

        ctx, layout, world = self.ctx, self.layout, self.world
        ctx.say(f"megatron-core: {layout.describe()} over {world.world_size} process(es)")
        # the training draws (LoRA dropout) start here, after building and loading drew what they
        # drew (megatron-core's initialisation draws per TP shard): the same at every TP size
        seed_everything(ctx.seed + layout.rng_stream)
        resumed = None
        if checkpoint is not None:
            state = json.loads((checkpoint / TRAINER_STATE).read_text())
            if state.get("backend") != "megatron":
                raise StageError(f"{checkpoint}: saved by parallel.backend: {state.get('backend', 'fsdp2')}; resume with that backend, or start a new run")
            if ema is not None and not state.get("ema"):
                raise StageError(f"{checkpoint}: saved without a moving average of the weights (training.ema was 0); resume with training.ema=0 or start a new run")
            load_megatron_checkpoint(self.model, checkpoint, optimizer, _averages(ema) or ())
            scheduler.load_state_dict(state["scheduler"])
            sampler.position = state["sampler_position"]
            step = int(state["step"])
            saved = state.get("layout", {})
            # Megatron's own streams first (reseeding them resets torch's): this rank's where the layout is the saved one
            _restore_megatron_rng(saved_rng(checkpoint, world.rank) if {"context_parallel": 1, **saved} == _layout_record(layout) else None, ctx.seed + 7919 * step)
            rank = _saved_rank_of(saved, layout)  # the rank whose random stream this one continues
            if rank is None or not restore_rng(checkpoint, world, rank):
                seed_everything(ctx.seed + layout.rng_stream + 7919 * step)  # a place the saved layout did not have: a stream of its own
            moved = (
                ""
                if (saved.get("tensor_parallel"), saved.get("pipeline_parallel"), saved.get("virtual_pipeline", 1), saved.get("context_parallel", 1))
                == (layout.tp, layout.pp, layout.virtual, layout.cp)
                else f" (saved at TP={saved.get('tensor_parallel')} x PP={saved.get('pipeline_parallel')}"
                f"{' x ' + str(saved['virtual_pipeline']) + ' virtual' if saved.get('virtual_pipeline', 1) > 1 else ''}"
                f"{' x CP=' + str(saved['context_parallel']) if saved.get('context_parallel', 1) > 1 else ''}, resharded)"
            )
            resumed = Resumed(step, float("nan") if state.get("loss") is None else float(state["loss"]), moved)
        self.shapes = None  # the training model on the meta device: what the recipe counts FLOPs on
        if self.recipe.flops is not None:
            from mmcore.checkpoint.sharded_load import parameters_on_meta

            with parameters_on_meta():
                self.shapes = self.recipe.build_model(ctx, self.upstream)
        return resumed

    # ---- step

    def forward_backward(self, batches: Sequence[dict[str, Any]], total_tokens: float) -> tuple[Any, float]:
        import torch

        from mmcore.backends.megatron.train import forward_backward

        family, device, recipe = self.family, self.device, self.recipe
        flops = sum(recipe.flops(self.shapes, batch) for batch in batches) if self.shapes is not None else 0.0  # type: ignore[misc]
        micro = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items() if k in family.inputs or k in ("labels", "num_loss_tokens")} for batch in batches]
        with self.precision.step():
            loss_sum = forward_backward(list(self.model), micro, family.loss_sum, total_tokens)
        return loss_sum, flops * self.layout.dp / self.world.world_size  # this replica's FLOPs, shared by its TP x PP processes

    def clip_gradients(self, max_norm: float | None) -> float:
        from mmcore.backends.megatron.train import clip_gradients, reduce_gradients, sum_tied_gradients

        for decoder in self.decoders:
            sum_tied_gradients(decoder)
        reduce_gradients(self.params)
        return clip_gradients(self.params, max_norm)  # over every stage and shard: the same on every rank

    def reduce_loss(self, loss_sum: Any) -> tuple[float, bool]:
        import torch
        import torch.distributed as dist

        total = torch.tensor([loss_sum], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=_dp_group(with_context_parallel=True))  # context-parallel ranks: each its tokens' loss
        value = total.item()
        # the loss lives on the last pipeline stage only: the stages agree on whether it is finite
        # (one reduction) before any of them updates, stops or skips
        bad = torch.tensor([0.0 if math.isfinite(value) else 1.0], device=self.device)
        dist.all_reduce(bad)
        return value, not bad.item()

    # ---- checkpoint, evaluation, the end

    def save(self, root: Path, step: int, optimizer: Any, scheduler: Any, sampler: Any, loss: float, ema: "MovingAverage | None") -> None:
        save(root, step, self.model, optimizer, scheduler, sampler, self.world, self.layout, loss, _averages(ema))

    def evaluate(self, ctx: "StageContext", recipe: "TrainRecipe", step: int) -> dict[str, float]:
        self.model.eval()
        with self.precision.step():
            metrics = evaluate_held_out(list(self.model), self.family, self.layout, self.device)
        self.model.train()
        return metrics

    def finish(self, root: Path, ema: "MovingAverage | None") -> Finished:
        """The trained weights in the family's names for export, the adapters, their averages."""
        model, family, layout, world, lora = self.model, self.family, self.layout, self.world, self.ctx.config.training.lora
        base = self.upstream["download"].output("model") if self.lora else None
        hub = write_trained(root / TRAINED, model, family, layout, world, self.converted)
        if self.lora:
            write_adapter(root / ADAPTER, model, family, layout, world, lora, base, hub, self.saved_hub, root / TRAINED)
        averages = _averages(ema)
        if averages is not None:  # the average written as the weights are, in their place for the while
            with _swapped(averages):
                hub = write_trained(root / EMA_OUTPUT, model, family, layout, world, self.converted)
                if self.lora:  # the adapters export writes beside the averaged weights
                    write_adapter(root / EMA_ADAPTER, model, family, layout, world, lora, base, hub, self.saved_hub, root / EMA_OUTPUT)
        outputs = {
            "checkpoint": f"{CHECKPOINTS}/{TRAINED}",
            "megatron_checkpoint": f"{CHECKPOINTS}/{LATEST}",
            **({"adapter": f"{CHECKPOINTS}/{ADAPTER}"} if self.lora else {}),
            **({EMA_OUTPUT: f"{CHECKPOINTS}/{EMA_OUTPUT}"} if ema is not None else {}),
            **({EMA_ADAPTER: f"{CHECKPOINTS}/{EMA_ADAPTER}"} if ema is not None and self.lora else {}),
        }
        return Finished(
            outputs=outputs,
            metrics={"backend": "megatron", **_layout_record(layout)},
            where=f" on megatron-core ({layout.describe()})",
            notes=[f"megatron checkpoint (resumes at any TP/PP/CP): {root / LATEST}; trained weights for export: {root / TRAINED}"],
        )

    def close(self) -> None:
        import torch.distributed as dist

        if self.own_group:
            dist.destroy_process_group()


def _averages(ema: "MovingAverage | None") -> list[tuple[Any, Any]] | None:
    """training.ema: this rank's (parameter, average) pairs, each average sharded as its parameter."""
    return [(ema.parameters[name], average) for name, average in ema.average.items()] if ema is not None else None


def evaluate_held_out(model: Sequence[Any], family: MegatronFamily, layout: Layout, device: Any) -> dict[str, float]:
    """The family's held-out figures (``score`` over ``held_out``, one sample a micro-batch,
    forward only): each data-parallel replica takes every DP-th sample, all its TP x PP ranks
    the same ones; empty without a score or held-out samples."""
    import torch

    from mmcore.backends.megatron.train import forward_scores

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
    """The recipe's family on megatron-core (a recipe that is a :class:`MegatronRecipe`), after
    refusing what this backend does not do yet."""
    cfg, parallel = ctx.config.training, ctx.config.parallel
    if not isinstance(recipe, MegatronRecipe):
        raise StageError(f"parallel.backend: megatron: the {ctx.pack} pack does not run on megatron-core" + (" for training.method: dpo" if cfg.method == "dpo" else ""))
    from mmcore.run.preflight import megatron_layout_problem

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
    family = recipe.megatron_family(ctx, upstream)
    if parallel.context_parallel > 1 and not family.context_parallel:
        raise StageError(f"parallel.context_parallel: the {ctx.pack} pack's model on megatron-core does not split its sequences (MegatronFamily.context_parallel)")
    if "extract" in upstream and family.use_cache is None:
        raise StageError(f"parallel.backend: megatron: the {ctx.pack} pack does not read the extract stage's feature cache on megatron yet (set extract.enabled=false)")
    return family


def _saved_rank_of(saved: Mapping[str, Any], layout: Layout) -> int | None:
    """The rank of a checkpoint saved at layout ``saved`` (its ``_layout_record``) whose random
    stream this rank continues: the first tensor-parallel rank of the same data-parallel replica
    and pipeline stage (megatron-core numbers ranks TP fastest, then CP, then DP, then PP; the
    context-parallel ranks of a replica share its stream), when the pipeline is split as it was
    and that replica existed; else None."""
    tp, pp, dp, cp = saved.get("tensor_parallel"), saved.get("pipeline_parallel"), saved.get("data_parallel"), int(saved.get("context_parallel", 1))
    if tp is None or dp is None or pp != layout.pp or layout.dp_rank >= dp:
        return None
    return int(tp) * cp * (layout.dp_rank + int(dp) * layout.stage)


def _layout_record(layout: Layout) -> dict[str, int | bool]:
    return {
        "tensor_parallel": layout.tp,
        "pipeline_parallel": layout.pp,
        "data_parallel": layout.dp,
        "sequence_parallel": layout.sequence_parallel,
        "virtual_pipeline": layout.virtual,
        "context_parallel": layout.cp,
    }


def _dp_group(with_context_parallel: bool = False) -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group(with_context_parallel=with_context_parallel)


def save(root: Path, step: int, model: Any, optimizer: Any, scheduler: Any, sampler: Any, world: Any, layout: Layout, loss: float, averages: Sequence[tuple[Any, Any]] | None = None) -> None:
    """``root/step-N``: the model, optimizer and moving average (``averages``: parameter and
    average pairs, none on a rank that trains nothing; None without training.ema) in megatron-core's ``dist_checkpointing``, with the scheduler, data
    position, layout and RNG states, by the engine's protocol."""
    from mmcore.backends.megatron.checkpoint import save as save_megatron_checkpoint

    trainer_state = {
        "step": step,
        "loss": loss,
        "scheduler": scheduler.state_dict(),
        "sampler_position": sampler.position,
        "backend": "megatron",
        "layout": _layout_record(layout),
        "ema": averages is not None,
    }
    commit_checkpoint(root, step, world, lambda partial: save_megatron_checkpoint(model, partial, optimizer, averages=averages or ()), trainer_state, more_rng=_megatron_rng)


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


__all__ = ["MegatronBackend", "evaluate_held_out", "save", "MEGATRON_RNG"]
