"""Expert parallelism (``parallel.expert_parallel: N``) for transformers MoE models on the FSDP2
backend: the experts of every MoE layer split over groups of N ranks, each token sent to the rank
that holds its expert by an all-to-all and its output sent back by a second one.

Why this shape (and not megatron-core's EP):

* **transformers' own EP.** transformers 5 declares each MoE model's expert-parallel plan
  (``model.ep_plan``: the fused ``gate_up_proj`` / ``down_proj`` tensors sharded by expert, the
  experts module reached through a token dispatch) and ships the dispatch (``AllToAllEP``, with
  autograd through both all-to-alls). Applying that plan runs the family's own experts forward
  on this rank's experts: no MoE code of ours, and every MoE pack on the VLM kit (Qwen3-VL-MoE,
  GLM-4.5V, Qwen3-Omni, Kimi-K2.5, Qwen3.5-MoE, DeepSeek-OCR-2) gets EP without a line of its own. megatron-core
  EP would need each family rebuilt as a megatron model, which only qwen2vl (dense) is.
* **Experts sharded twice, as torchtitan and transformers' FSDP do.** The expert tensors are
  DTensors ``Shard(0)`` on the ``ep`` dimension of a ``(efsdp, ep, tp=1)`` mesh; FSDP2 shards
  each experts module again over ``efsdp`` (the EP groups holding copies of the same experts:
  processes / N), every other module over all processes as before. Checkpoints hold the experts
  at their global shapes, so DCP reshards them to another EP size on resume.
* **The gradient of an expert covers every rank's tokens.** The train loop scales each rank's
  loss by processes / global tokens and FSDP averages over the group it reduces in; an expert's
  gradient already sums the tokens its EP group sent it, so its FSDP group (efsdp) divides by
  all processes, not its own size (``set_gradient_divide_factor``).
* **The router is untouched:** it routes this rank's tokens on this rank, so a router aux loss is
  computed as without EP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mmcore.errors import StageError


@dataclass
class ExpertSplit:
    """Where a model's experts went: the mesh (``efsdp``, ``ep``, ``tp``), the experts modules
    (each to be FSDP-sharded over ``efsdp``) and the processes an expert's gradient averages over."""

    mesh: Any
    modules: list[Any]
    processes: int
    local_experts: int


def concrete_plan(model: Any) -> dict[str, str]:
    """transformers' ``model.ep_plan`` with its ``*`` layer wildcards resolved to this model's
    module and parameter names."""
    plan = dict(getattr(model, "ep_plan", None) or {})
    names = {name for name, _ in model.named_modules()} | {name for name, _ in model.named_parameters()}
    out: dict[str, str] = {}
    for pattern, style in plan.items():
        regex = re.compile(re.escape(pattern).replace(r"\*", r"\d+") + "$")
        out.update((name, style) for name in names if regex.match(name))
    return out


def split_experts(model: Any, size: int, world_size: int, device_type: str) -> ExpertSplit:
    """Shard ``model``'s experts over groups of ``size`` consecutive ranks (every rank calls
    this: it creates process groups) and route its tokens through transformers' all-to-all."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    plan = concrete_plan(model)
    dispatched = [name for name, style in plan.items() if style == "ep_dispatch_experts"]
    if not dispatched:
        raise StageError(f"parallel.expert_parallel={size}: the model ({type(model).__name__}) has no experts transformers can split (no expert-parallel plan)")
    modules = dict(model.named_modules())
    experts = [modules[name] for name in sorted(dispatched)]
    adapted = [name for name in sorted(dispatched) if any("lora_" in n for n, _ in modules[name].named_parameters())]
    if adapted:  # LoRA beside split experts is fine (measured); adapters inside them would need splitting too
        raise StageError(f"parallel.expert_parallel={size}: training.lora adapts the experts ({adapted[0]}); leave them out of training.lora.target_modules")
    counts = {getattr(module, "num_experts", 0) for module in experts}
    if any(count % size for count in counts):
        raise StageError(f"parallel.expert_parallel={size} does not divide the {sorted(counts)} experts of each MoE layer")
    mesh = init_device_mesh(device_type, (world_size // size, size, 1), mesh_dim_names=("efsdp", "ep", "tp"))
    # all_to_all in training and evaluation alike: the ranks of an EP group hold different batches
    apply_expert_parallelism(model, mesh["ep"], mesh["tp"], plan, ep_implementation="all_to_all")
    return ExpertSplit(mesh, experts, world_size, experts[0].num_experts)


def shard_experts(split: ExpertSplit, options: dict[str, Any]) -> None:
    """FSDP2 over each experts module's ``efsdp`` copies (before the blocks that hold them), the
    gradient divided by every process (module docstring)."""
    from torch.distributed.fsdp import fully_shard

    copies = split.mesh["efsdp"]
    for module in split.modules:
        fully_shard(module, **{**options, "mesh": copies})
        module.set_gradient_divide_factor(float(split.processes))
        if copies.size() > 1:
            # a divide factor other than the group's size is a PREMUL_SUM, which gloo refuses: sum, then divide
            module.set_force_sum_reduction_for_comms(True)


def check_expert_parallel(size: int, world_size: int) -> None:
    """``parallel.expert_parallel`` > 1: what the split needs, refused in one line where it is missing."""
    if world_size % size:
        raise StageError(f"parallel.expert_parallel={size} does not divide the {world_size} processes")


__all__ = ["ExpertSplit", "concrete_plan", "split_experts", "shard_experts", "check_expert_parallel"]
