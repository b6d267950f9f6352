"""The FSDP2 backend (``parallel.backend: fsdp2``, torch.distributed ``fully_shard``) as the train
loop drives it (:class:`mmcore.backends.protocol.Backend`).

Shards each module the recipe names (decoder layers, vision blocks), then the root. The backend
owns mixed precision whatever the number of processes (as torchtitan does): with bf16 it shards
over a one-process group too, so one and N processes compute alike: fp32 parameters and
optimizer state, bf16 compute, fp32 gradient reduction. A single fp32 process without offload
runs the model unsharded. With ``parallel.replicate`` > 1 the mesh is 2-D (HSDP): replicas
across its first dimension, shards within each. Checkpoints are DCP (:mod:`mmcore.checkpoint.training`),
reshardable; with ``training.lora`` they hold the adapters (and the modules saved whole) only.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from mmcore.backends.protocol import Finished, Prepared, Resumed
from mmcore.backends.experts import check_expert_parallel, shard_experts, split_experts
from mmcore.checkpoint.training import CHECKPOINTS, LATEST, load_checkpoint, save_average, save_checkpoint, seed_everything
from mmcore.train.ema import EMA_OUTPUT
from mmcore.errors import StageError
from mmcore.train.guards import lora_size_warning
from mmcore.framework.files import ensure_free_space
from mmcore.train.optim import STATE_COPIES, clip_grad_norm, freeze
from mmcore.train.recompute import apply_recompute
from mmcore.run.rundir import RunDir
from mmcore.checkpoint.sharded_load import load_weights, materialise, on_meta, parameters_on_meta

if TYPE_CHECKING:
    from mmcore.framework.context import StageContext
    from mmcore.train.ema import MovingAverage
    from mmcore.run.rundir import Manifest
    from mmcore.train.loop import TrainRecipe


class FSDP2Backend:
    name = "fsdp2"

    # ---- setup

    def setup(self, ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe", resume_from: Path | None) -> Prepared:
        import torch
        import torch.distributed as dist

        from mmcore.train.loop import computes_in_bf16

        self.ctx, self.recipe, self.world, cfg = ctx, recipe, ctx.world, ctx.config.training
        world, accelerator = ctx.world, ctx.accelerator
        self.device = device = accelerator.device(world.local_rank)
        sequence = ctx.config.parallel.ulysses
        data_rank, data_ranks = world.rank // sequence, world.world_size // sequence  # a sequence group shares its rows
        seed_everything(ctx.seed + data_rank)
        # build (without memory where the recipe loads through the engine), freeze, recompute,
        # shard, then materialise and load each rank's shards
        bf16 = computes_in_bf16(cfg.precision, accelerator)
        if cfg.cpu_offload and accelerator.device_type == "cpu":
            raise StageError("training.cpu_offload keeps weights in host memory while an accelerator computes; this run computes on the CPU (run.device: cpu)")
        split = ctx.config.parallel
        if split.tensor_parallel > 1 or split.pipeline_parallel > 1 or split.sequence_parallel or split.virtual_pipeline > 1 or split.context_parallel > 1:
            raise StageError(
                f"parallel.tensor_parallel / pipeline_parallel / sequence_parallel / virtual_pipeline / context_parallel split the model on parallel.backend: megatron; this run's backend is {split.backend}"
            )
        if sequence > 1:
            _check_ulysses(ctx, recipe, sequence)
        if split.expert_parallel > 1:
            check_expert_parallel(split.expert_parallel, world.world_size)
        # bf16 and offload are FSDP2 policies: a single process shards too, over a group of its own
        self.sharding = bool(world.distributed or bf16 or cfg.cpu_offload)
        self.sync_every = split.gradient_sync == "micro_batch"
        self.own_group = self.sharding and not world.distributed and not dist.is_initialized()
        if self.own_group:
            dist.init_process_group(accelerator.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
        if recipe.weights is not None:
            with parameters_on_meta():
                model = recipe.build_model(ctx, upstream)
        else:
            model = recipe.build_model(ctx, upstream)
        frozen = freeze(model, cfg.freeze, recipe.freeze_groups)
        blocks = recipe.shard_modules(model)
        ckpt_root = ctx.stage_dir / CHECKPOINTS
        self.plan = plan = _add_adapters(ctx, upstream, recipe, model, blocks, ckpt_root) if cfg.lora.r else None
        if plan is not None:
            frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
        apply_recompute(blocks, cfg.recompute)
        model = self._shard(model, blocks, bf16=bf16, offload=cfg.cpu_offload, replicate=split.replicate, experts=split.expert_parallel)
        if on_meta(model):
            materialise(model, torch.device("cpu") if cfg.cpu_offload else device)
            if resume_from is None or plan is not None:  # a resume overwrites every weight it trains
                assert recipe.weights is not None
                load_weights(model, recipe.weights(ctx, upstream), distributed=world.distributed, names=_checkpoint_names(plan))
        if plan is not None and resume_from is None:
            from mmcore.train.lora import init_adapters

            init_adapters(model, plan, ctx.seed)
        self.model, self.params = model, [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise StageError("every parameter is frozen (training.freeze): nothing to train")
        if world.is_local_main:
            self._check_disk_space(cfg)
        self.keep, self.files = _lora_checkpoint(model, plan)
        return Prepared(model=model, trained=self.params, optimizer_params=self.params, frozen=len(frozen), bf16=bf16, data_rank=data_rank, data_ranks=data_ranks)

    def _shard(self, model: Any, shard_modules: list[Any], *, bf16: bool, offload: bool, replicate: int, experts: int = 1) -> Any:
        import torch

        if not self.sharding:
            return model if on_meta(model) else model.to(self.device)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        world = self.world
        if world.world_size % replicate:
            raise StageError(f"parallel.replicate={replicate} does not divide the {world.world_size} processes")
        shape = (replicate, world.world_size // replicate) if replicate > 1 else (world.world_size,)
        names = ("replicate", "shard") if replicate > 1 else ("shard",)
        mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        options = {"mesh": mesh, "mp_policy": policy, "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
        if not on_meta(model) and not offload:
            model = model.to(self.device)
        if experts > 1:  # the experts first, so the blocks holding them leave them to their own groups
            split = split_experts(model, experts, world.world_size, self.device.type)
            shard_experts(split, options)
            self.ctx.say(
                f"expert parallel: each MoE layer's {split.local_experts * experts} experts split over groups of {experts} processes, {split.local_experts} on each ({len(split.modules)} layers)"
            )
        for module in shard_modules:
            fully_shard(module, **options)
            # before FSDP's own post-forward hook (registered by fully_shard, not prepended)
            module.register_forward_hook(outputs_without_views, prepend=True)
        fully_shard(model, **options)
        model.register_forward_hook(root_output_without_views, prepend=True)
        return model

    def _check_disk_space(self, cfg: Any) -> None:
        """A checkpoint: every weight (LoRA: the trained ones) plus the optimizer's state of the trained ones."""
        ctx, model, plan = self.ctx, self.model, self.plan
        held = self.params if plan is not None else list(model.parameters())
        checkpoint_bytes = sum(p.numel() * p.element_size() for p in held) + sum((STATE_COPIES[cfg.optimizer] + bool(cfg.ema)) * p.numel() * 4 for p in self.params)
        previous = RunDir(ctx.run_dir).replaced_dir(ctx.stage)
        hint = f"free disk space, e.g. delete {previous} (the previous finished training, kept until this one finishes)" if previous.exists() else "free disk space or point --run-dir at a larger disk"
        ensure_free_space(ctx.stage_dir, checkpoint_bytes, "a training checkpoint", hint=hint)
        if plan is not None and (warning := lora_size_warning(plan.r, checkpoint_bytes, sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad))):
            ctx.say(warning)

    def start(self, checkpoint: Path | None, optimizer: Any, scheduler: Any, sampler: Any, ema: "MovingAverage | None") -> Resumed | None:
        if checkpoint is None:
            return None
        if self.plan is not None:
            _check_same_adapters(checkpoint, self.plan)
        state = load_checkpoint(checkpoint, self.model, optimizer, scheduler, sampler, self.world, self, keep=self.keep, ema=_average(ema))
        latest = checkpoint.parent / LATEST
        pointed = latest.resolve() if latest.is_symlink() else None
        how = "" if pointed == checkpoint.resolve() else f" ({LATEST} did not point at a complete checkpoint; took the newest complete one, {checkpoint.name})"
        return Resumed(int(state["step"]), float("nan") if state.get("loss") is None else float(state["loss"]), how)

    # ---- step

    def forward_backward(self, batches: Sequence[dict[str, Any]], total_tokens: float) -> tuple[Any, float]:
        import torch

        model, recipe = self.model, self.recipe
        loss_sum = torch.zeros((), device=self.device)
        flops = 0.0
        for i, batch in enumerate(batches):
            batch = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            if self.sharding:  # reduce gradients once, after the last micro-batch (parallel.gradient_sync: step)
                model.set_requires_gradient_sync(self.sync_every or i == len(batches) - 1)
            loss = recipe.loss(model, batch)  # bf16 compute is the sharding's mixed-precision policy
            (loss * (self.world.world_size / total_tokens)).backward()
            loss_sum += loss.detach().float()
            if recipe.flops is not None:
                flops += recipe.flops(model, batch)
        return loss_sum, flops

    def clip_gradients(self, max_norm: float | None) -> float:
        return clip_grad_norm(self.params, max_norm)  # model-wide: the same on every rank

    def reduce_loss(self, loss_sum: Any) -> tuple[float, bool]:
        import math

        import torch.distributed as dist

        if self.world.distributed:
            dist.all_reduce(loss_sum)  # a nan on one rank is every rank's
        total = loss_sum.item()
        return total, math.isfinite(total)

    # ---- checkpoint, evaluation, the end

    def save(self, root: Path, step: int, optimizer: Any, scheduler: Any, sampler: Any, loss: float, ema: "MovingAverage | None") -> None:
        save_checkpoint(root, step, self.model, optimizer, scheduler, sampler, self.world, self, loss=loss, keep=self.keep, files=self.files, ema=_average(ema))

    def evaluate(self, ctx: "StageContext", recipe: "TrainRecipe", step: int) -> dict[str, float]:
        import torch

        if recipe.evaluate is None:
            return {}
        self.model.eval()
        with torch.no_grad():
            metrics = recipe.evaluate(ctx, self.model, step)
        self.model.train()
        return metrics

    def finish(self, root: Path, ema: "MovingAverage | None") -> Finished:
        from torch.distributed.fsdp import FSDPModule

        done = Finished(outputs={"checkpoint": f"{CHECKPOINTS}/{LATEST}"}, metrics={"sharded": isinstance(self.model, FSDPModule)})
        if ema is not None:
            save_average(root / EMA_OUTPUT, self.model, ema.state_dict(), self.world, keep=self.keep, files=self.files)  # beside the steps: a LoRA plan's base path holds
            done.outputs[EMA_OUTPUT] = f"{CHECKPOINTS}/{EMA_OUTPUT}"
        plan = self.plan
        if plan is not None:
            trained = sum(p.numel() for p in self.params)
            done.metrics["lora"] = {"r": plan.r, "alpha": plan.alpha, "targets": len(plan.targets), "modules_to_save": len(plan.modules_to_save), "trained_parameters": trained}
            done.notes.append(f"LoRA r={plan.r} on {len(plan.targets)} layer(s): {trained:,} trained parameters; the base stays as converted")
        return done

    def close(self) -> None:
        import torch.distributed as dist

        if self.own_group:
            dist.destroy_process_group()


def _check_ulysses(ctx: "StageContext", recipe: "TrainRecipe", sequence: int) -> None:
    """``parallel.ulysses`` > 1: what the split needs, refused in one line where it is missing."""
    world, cfg = ctx.world, ctx.config.training
    if world.world_size % sequence:
        raise StageError(f"parallel.ulysses={sequence} does not divide the {world.world_size} processes")
    if not recipe.ulysses:
        raise StageError(f"parallel.ulysses: pack {ctx.pack!r} with training.method {cfg.method} does not split its sequences (the VLM and diffusion kits' supervised fine-tuning do)")


def _average(ema: "MovingAverage | None") -> dict[str, Any] | None:
    return ema.state_dict() if ema is not None else None


# --------------------------------------------------------------------------- LoRA


def _add_adapters(ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe", model: Any, blocks: list[Any], ckpt_root: Path) -> Any:
    """``training.lora``: plan the adapters against the model and inject them (before sharding)."""
    from mmcore.train.lora import base_identity, inject, plan_lora, relative_base

    cfg = ctx.config.training
    try:
        import peft  # noqa: F401
    except ImportError:
        raise StageError("training.lora trains adapters through peft, which is not installed here: pip install 'mmcore[lora]'") from None
    if recipe.weights is None:
        raise StageError(f"training.lora: pack {ctx.pack!r} does not load its weights through the engine, so the base of the adapters is unknown")
    path, fingerprint = base_identity(recipe.weights(ctx, upstream), upstream)
    frozen = [g for p in cfg.freeze for g in recipe.freeze_groups.get(p, [p])]
    plan = plan_lora(model, cfg.lora, groups=recipe.freeze_groups, default_targets=recipe.lora_targets, blocks=blocks, frozen=frozen, base=(relative_base(path, ckpt_root), fingerprint))
    inject(model, plan)
    return plan


def _checkpoint_names(plan: Any) -> Callable[[str], str | None]:
    if plan is None:
        return lambda key: key
    from mmcore.train.lora import base_key

    return base_key


def _lora_checkpoint(model: Any, plan: Any) -> tuple[set[str] | None, dict[str, Any]]:
    """(the model state a checkpoint holds: None for all of it, the plan file it carries)."""
    if plan is None:
        return None, {}
    from mmcore.train.lora import LORA_FILE, trained_names

    return set(trained_names(model, plan)), {LORA_FILE: asdict(plan)}


def _check_same_adapters(checkpoint: Path, plan: Any) -> None:
    from mmcore.train.lora import LORA_FILE, LoraPlan

    saved = LoraPlan.read(checkpoint)
    if saved is None:
        raise StageError(f"{checkpoint}: a full fine-tuning checkpoint; this run trains LoRA adapters (training.lora.r={plan.r}): start a new run or set training.lora.r=0")
    if saved.base_fingerprint != plan.base_fingerprint:
        raise StageError(
            f"{checkpoint / LORA_FILE}: these adapters were trained on another base checkpoint ({saved.base_fingerprint[:12]}, this run's is {plan.base_fingerprint[:12]}): resuming would put them on the wrong weights"
        )
    for name in ("r", "alpha", "targets", "modules_to_save"):
        if getattr(saved, name) != getattr(plan, name):
            raise StageError(f"{checkpoint / LORA_FILE}: saved with another training.lora ({name} differs): start a new run to change the adapters")


# --------------------------------------------------------------------------- the sharded root's output


#: Fields of transformers' multimodal outputs (``MultimodalModelOutput``) that hold the towers'
#: own outputs: their ``pooler_output`` is the image/video/audio embeddings ``torch.split`` per
#: item, views of one tensor.
TOWER_OUTPUTS = ("image_outputs", "video_outputs", "audio_outputs")


def root_output_without_views(module: Any, args: Any, output: Any) -> Any:
    """The sharded root's output with no view among its grad-requiring tensors.

    FSDP2 registers its pre-backward hook on every grad-requiring tensor a sharded module
    returns, and warns for each view among them ("... can cause backward to fail or produce
    wrong gradients": an in-place op on a view, ``out += y``, would drop the hook and skip the
    all-gather); it warned on every rank at every step. The views were (1) transformers'
    multimodal outputs' ``image_outputs``/``video_outputs``/``audio_outputs``, the towers'
    embeddings split per item, which the language model has consumed and no loss reads: dropped;
    (2) diffusers' transformers' prediction, unpatchified by ``reshape`` (a view of the permuted
    tensor): cloned, one copy of a latent-sized tensor per forward, so whatever the loss does
    with it the hook stays. Neither changes a number: 2 ranks still equal 1.
    """
    if isinstance(output, Mapping):
        for name in TOWER_OUTPUTS:
            if output.get(name) is not None:
                output[name] = None
    return outputs_without_views(module, args, output)


def outputs_without_views(module: Any, args: Any, output: Any) -> Any:
    """A sharded block's output with its grad-requiring views cloned, for the reason
    :func:`root_output_without_views` gives: diffusers' single-stream blocks (FLUX,
    HunyuanVideo) return their joint sequence split back into text and image halves, two views
    of one tensor, and FSDP2 warned for each at every block, step and rank."""
    if isinstance(output, Mapping):
        for name, value in list(output.items()):
            if is_grad_view(value):
                output[name] = value.clone()
        return output
    if type(output) in (tuple, list):
        return type(output)(value.clone() if is_grad_view(value) else value for value in output)
    return output.clone() if is_grad_view(output) else output


def is_grad_view(value: Any) -> bool:
    return getattr(value, "_base", None) is not None and value.requires_grad


__all__ = ["FSDP2Backend", "outputs_without_views", "root_output_without_views"]


@contextmanager
def local_forwards(model: Any) -> Iterator[None]:
    """Inside the block every forward of ``model`` runs on this process alone: a sharded
    (FSDP2) model's parameters are gathered once on entry (every process enters, in the same
    order) and kept whole until the block ends, so that processes may run different numbers of
    forwards, as sampling answers of different lengths does. A model that is not sharded is
    left as it is."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if sharded and model is sharded[0]:
        # FSDP decides which module is the root at its first forward; a block unsharded before
        # that would take the role. torch has no public call for it (2.13): the root's own lazy init.
        model._get_fsdp_state()._lazy_init()
    for module in sharded:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()
            # fully_shard's default: the root keeps its parameters after forward, every other module reshards
            module.set_reshard_after_forward(module is not model, recurse=False)
