"""What the train loop does to parameters: the optimizer (``training.optimizer``, one builder
for every backend), freeze groups, the lr schedule, clipping."""

from __future__ import annotations

import fnmatch
import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.errors import StageError

if TYPE_CHECKING:
    import torch
    from torch import nn


def freeze(model: "nn.Module", patterns: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """Freeze parameters matching ``patterns`` (group names or globs); returns the frozen names."""
    frozen = set(frozen_names([name for name, _ in model.named_parameters()], patterns, groups))
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    return [name for name, _ in model.named_parameters() if name in frozen]


def frozen_names(names: Sequence[str], patterns: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """The ``names`` that ``patterns`` (``training.freeze``: group names or globs) freeze; a
    pattern that is no group and matches no name is a one-line error."""
    globs: list[str] = []
    for pattern in patterns:
        globs.extend(groups.get(pattern, [pattern]))
    unmatched = [p for p in patterns if p not in groups and not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        known = ", ".join(groups) or "none"
        raise StageError(f"training.freeze: {unmatched[0]!r} matches no parameter and is no group (groups: {known})")
    return [name for name in names if any(fnmatch.fnmatchcase(name, g) for g in globs)]


#: ``training.optimizer`` -> optimizer state tensors per trained parameter (a checkpoint's size):
#: AdamW's two moments, SGD's momentum buffer, Adafactor's row and column second moments (~0)
STATE_COPIES = {"adamw": 2, "sgd": 1, "adafactor": 0}


#: where torch's Adafactor cannot run (found by a two-process FSDP2 run: ``aten.pow_`` on a partial DTensor)
ADAFACTOR_UNSHARDED = (
    "adafactor runs on unsharded parameters only (one process, fp32; torch.optim.Adafactor does not take FSDP2's sharded ones): use adamw or sgd, or --nproc-per-node 1 with training.precision: fp32"
)


def build_optimizer(params: "Sequence[nn.Parameter] | Sequence[dict]", cfg: Any) -> "torch.optim.Optimizer":
    """The optimizer ``cfg`` (``training``) asks for over ``params`` (tensors or one group), the
    same on FSDP2 and megatron; its state is a torch optimizer's, saved and resumed by either
    backend's checkpoint. ``foreach=False``: per-parameter kernels, the same numbers however the
    parameters are sharded or grouped."""
    import torch

    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=False)
    if not hasattr(torch.optim, "Adafactor"):
        raise StageError(f"training.optimizer: adafactor is torch.optim.Adafactor, which torch {torch.__version__} lacks (torch >= 2.5 has it); use adamw or sgd")
    if any(type(p).__name__ == "DTensor" for p in params):  # its factored moments reduce over the sharded dimension in place: DTensor refuses
        raise StageError(f"training.optimizer: {ADAFACTOR_UNSHARDED}")
    return torch.optim.Adafactor(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)


def empty_state(optimizer: "torch.optim.Optimizer", parameter: "torch.Tensor") -> dict[str, Any]:
    """The state ``optimizer`` keeps for ``parameter`` once it has stepped, zeroed: what a
    checkpoint that must know its shapes before reading (megatron's) loads into."""
    import torch

    if isinstance(optimizer, torch.optim.AdamW):
        return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(parameter), "exp_avg_sq": torch.zeros_like(parameter)}
    if isinstance(optimizer, torch.optim.SGD):
        return {"momentum_buffer": torch.zeros_like(parameter)} if optimizer.defaults["momentum"] else {}
    raise StageError(f"training.optimizer: {type(optimizer).__name__}'s state cannot be laid out for this checkpoint; use adamw or sgd")


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


def run_schedule(cfg: Any, planned: int) -> Callable[[int], float]:
    """The factor of ``training.lr`` at each step (``cfg``: the training section): its
    ``lr_schedule`` over ``planned`` steps; with ``method: grpo`` and ``grpo.lr``, that learning
    rate, constant, from the first rollout after the supervised warm-up on."""
    factor = lr_lambda(cfg.lr_schedule, cfg.warmup_steps, planned, cfg.min_lr_ratio)
    grpo = getattr(cfg, "grpo", None)
    if cfg.method != "grpo" or grpo is None or grpo.lr is None:
        return factor
    switch, ratio = grpo.warmup_sft_steps, grpo.lr / cfg.lr
    return lambda step: factor(step) if step < switch else ratio


def clip_grad_norm(params: "Sequence[nn.Parameter]", max_norm: float | None) -> float:
    """Clip the gradients of ``params`` (the trained ones, listed once: walking the model's
    parameters every step costs about a millisecond) to ``max_norm``; returns their norm."""
    import torch

    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    groups: dict[Any, list[Any]] = {}
    for p in params:  # DTensors of one mesh each (split experts live on a mesh of their own)
        groups.setdefault(getattr(p, "device_mesh", None), []).append(p)
    if len(groups) == 1:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    norms = [torch.nn.utils.get_total_norm([p.grad for p in group]) for group in groups.values()]
    total = torch.linalg.vector_norm(torch.stack([n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]))
    if max_norm is not None:
        for group in groups.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return float(total)


__all__ = ["build_optimizer", "empty_state", "STATE_COPIES", "freeze", "frozen_names", "lr_lambda", "run_schedule", "clip_grad_norm"]
