"""The train loop's side of methods that learn from the model's own samples (GRPO): when a
step samples (:meth:`TrainRecipe.rollout`), the rollout batches reused over
``steps_per_rollout`` steps, and what the engine checks of a recipe's method.

A rollout is sampled on the steps that are multiples of ``steps_per_rollout`` (and on every
step the recipe answers None for, a supervised warm-up step); checkpoints fall on those steps
too (the recipe checks ``training.checkpoint_every``), so a resumed run samples its rollout
from the same weights as an uninterrupted one and continues identically.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mmcore.errors import StageError

if TYPE_CHECKING:
    from mmcore.framework.context import StageContext
    from mmcore.train.recipe import TrainRecipe


def check_method(ctx: "StageContext", recipe: "TrainRecipe") -> None:
    """Refuse a run whose ``training.method`` the pack's recipe does not train (before, a pack
    without DPO trained ``method: dpo`` as SFT, silently)."""
    from mmcore.train.recipe import TrainRecipe

    wanted = ctx.config.training.method
    declared = type(recipe) is not TrainRecipe or "method" in vars(recipe)
    if wanted != recipe.method and (declared or wanted == "grpo"):
        raise StageError(f"training.method={wanted}: the {ctx.pack} pack's recipe trains with training.method={recipe.method}; it has no {wanted} recipe")


def check_rollout_window(cfg: Any) -> None:
    """Refuse a GRPO config whose rollouts a resumed run could not sample from the same weights
    (``cfg``: the ``training`` section): with ``training.grpo.epochs`` > 1 (steps per rollout)
    checkpoints and the warm-up's end must fall on rollout steps, and the run is counted in steps."""
    window = cfg.grpo.epochs
    if window > 1:
        if cfg.checkpoint_every % window or cfg.grpo.warmup_sft_steps % window:
            raise StageError(
                f"training.grpo.epochs={window}: training.checkpoint_every ({cfg.checkpoint_every}) and training.grpo.warmup_sft_steps "
                f"({cfg.grpo.warmup_sft_steps}) must be multiples of it, so that a resumed run samples its rollout from the same weights"
            )
        if cfg.epochs is not None:
            raise StageError(f"training.grpo.epochs={window} trains each rollout several steps: give training.steps rather than training.epochs")


INDEX = "grpo_index"  # a sample's dataset index, for its rollout seed


class IndexedSamples:
    """A split's samples, each with its dataset index (``grpo_index``): the seed of its rollout
    (answers, or generated samples), whichever micro-batch and rank it lands in."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.data[i], INDEX: i}

    def __getattr__(self, name: str) -> Any:  # meta, length, index, split: the dataset's
        return getattr(self.data, name)


class Rollouts:
    """The rollout batches of the current window and the time the last sampling took."""

    def __init__(self, ctx: "StageContext", recipe: "TrainRecipe", model: Any, device: Any, group: Any = None) -> None:
        self.ctx, self.recipe, self.model, self.device, self.group = ctx, recipe, model, device, group
        self.held: tuple[list[dict[str, Any]], float] | None = None
        self.seconds = 0.0

    @classmethod
    def of(cls, ctx: "StageContext", recipe: "TrainRecipe", model: Any, device: Any, ready: Any) -> "Rollouts | None":
        return cls(ctx, recipe, model, device, ready.data_group) if recipe.rollout is not None else None

    def fresh_optimizer(self, step: int) -> bool:
        """Whether step ``step`` (0-based) is the first rollout after a supervised warm-up and the
        optimizer's state starts afresh there (``training.grpo.fresh_optimizer``). A step number,
        not an event: a run resumed from the warm-up's last checkpoint clears it at the same step."""
        settings = self.ctx.config.training.grpo
        return bool(settings.fresh_optimizer and settings.warmup_sft_steps and step == settings.warmup_sft_steps)

    def draws(self, step: int) -> bool:
        """Whether step ``step`` (0-based) draws and collates its own data."""
        return self.held is None or step % max(1, self.recipe.steps_per_rollout) == 0

    def reuse(self) -> tuple[list[dict[str, Any]], float, float, dict[str, float]]:
        """The window's batches again, in the shape :func:`~mmcore.train.loop.step_batches` returns."""
        assert self.held is not None
        self.seconds = 0.0
        micro, total = self.held
        return micro, total, 0.0, {}

    def sample(self, micro: list[dict[str, Any]], step: int) -> tuple[list[dict[str, Any]], float] | None:
        """The batches step ``step`` trains on and their loss units over the data-parallel
        ranks; None where the recipe trains on the collated batches (a warm-up step)."""
        import torch
        import torch.distributed as dist

        from mmcore.backends.fsdp2 import local_forwards

        assert self.recipe.rollout is not None
        t0 = time.perf_counter()
        self.model.eval()
        with torch.no_grad(), local_forwards(self.model):
            sampled = self.recipe.rollout(self.ctx, self.model, micro, step)
        self.model.train()
        self.held, self.seconds = None, 0.0
        if sampled is None:
            return None
        total = torch.tensor(float(sum(b["num_loss_tokens"] for b in sampled)), dtype=torch.float32 if self.device.type == "npu" else torch.float64, device=self.device)
        if self.ctx.world.distributed or self.group is not None:
            dist.all_reduce(total, group=self.group)
        global_tokens = max(float(total.item()), 1.0)
        self.held, self.seconds = (sampled, global_tokens), time.perf_counter() - t0
        return sampled, global_tokens


__all__ = ["INDEX", "IndexedSamples", "Rollouts", "check_method", "check_rollout_window"]
