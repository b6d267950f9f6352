"""Training that goes wrong stops: a step whose loss or gradient norm is not finite ends the run
with one line naming the step (``training.on_nonfinite: stop``) or is skipped without an update
(``skip``), and no checkpoint is written from weights that are not finite. Both train loops
(FSDP2's :mod:`mmcore.train.loop`, :mod:`mmcore.backends.megatron.engine`) use it.

Every rank must decide alike, or the ranks that stop leave the others waiting in a collective:
the loops hand :meth:`NonFinite.check` a loss summed over the ranks and a model-wide gradient
norm, the same numbers on every rank; :func:`weights_finite` reduces its own flag.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from mmcore.errors import StageError

HINT = "lower training.lr, or set training.on_nonfinite: skip to skip such steps"


def last_checkpoint(root: Path) -> str:
    """Where a stopped run can resume from, for its error line."""
    from mmcore.checkpoint.training import newest_complete

    newest = newest_complete(root)
    if newest is None:
        return "no checkpoint was written before it (training.checkpoint_every)"
    return f"the last checkpoint, {newest}, is kept"


class NonFinite:
    """``training.on_nonfinite`` over a run: :meth:`check` says whether a step's update applies."""

    def __init__(self, setting: str, checkpoints: Path) -> None:
        self.setting = setting
        self.checkpoints = checkpoints
        self.skipped = 0

    def check(self, step: int, loss: float, grad_norm: float) -> bool:
        """True when step ``step`` (counted from 1) may update the weights; False to skip it;
        raises under ``stop``."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            return True
        what = f"the loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm}"
        if self.setting == "skip":
            self.skipped += 1
            return False
        raise StageError(f"training stopped at step {step}: {what}; no update was made and {last_checkpoint(self.checkpoints)}", hint=HINT)


def weights_finite(params: Iterable[Any], world: Any, device: Any, group: Any = None) -> bool:
    """Whether every rank's part of ``params`` is finite (a reduction over ``group``, or the
    world: every rank gets the same answer; ``device``: where the collective library reduces)."""
    import torch
    import torch.distributed as dist

    bad = 0.0
    for param in params:
        local = param.to_local() if hasattr(param, "to_local") else param  # a DTensor: this rank's shard
        if local.numel() and not bool(torch.isfinite(local.detach()).all()):
            bad = 1.0
            break
    if world.distributed or group is not None:
        flag = torch.tensor([bad], device=device)
        dist.all_reduce(flag, group=group)
        bad = flag.item()
    return not bad


def refuse_nonfinite_checkpoint(params: Iterable[Any], world: Any, step: int, checkpoints: Path, device: Any, group: Any = None) -> None:
    """Before saving step ``step``: weights that are not finite (an update that overflowed
    after a finite loss) end the run instead of becoming a checkpoint."""
    if not weights_finite(params, world, device, group):
        raise StageError(f"training stopped at step {step}: the weights are no longer finite (an update overflowed), so they were not saved; {last_checkpoint(checkpoints)}", hint=HINT)


def lora_size_warning(r: int, checkpoint_bytes: int, base_bytes: int) -> str | None:
    """A warning when a LoRA checkpoint (adapters and their optimizer state) outweighs the base
    weights it adapts: a rank that large saves little over full fine-tuning, and is usually a typo."""
    if checkpoint_bytes <= base_bytes:
        return None
    return (
        f"warning: training.lora.r={r}: each checkpoint will be about {checkpoint_bytes / 2**30:.3g} GiB, more than the "
        f"{base_bytes / 2**30:.3g} GiB of base weights it adapts; a smaller rank trains faster and saves less"
    )


__all__ = ["lora_size_warning", "NonFinite", "weights_finite", "refuse_nonfinite_checkpoint", "last_checkpoint"]


#: set to 1 (conformance does, for its tiny run), the loop checks that a recipe with
#: ``sample_seeds`` draws nothing from torch's global RNG in a step's forward and backward
CHECK_GLOBAL_RNG = "MMCORE_CHECK_GLOBAL_RNG"


class GlobalRngCheck:
    """Whether a step's forward and backward left torch's global generators (the CPU's, and the
    accelerator's where the model is on one) as they found them. A recipe with ``sample_seeds``
    promises each sample's randomness comes from its own seed: ``torch.randn`` without a
    generator instead draws per process, so 2 processes no longer train as 1 (a resumed run still
    matches, as checkpoints hold every RNG state: only this check sees it). Nothing else draws
    there: dropout and attention dropout at p=0 return early without touching a generator."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device_module = None if device.type == "cpu" else getattr(torch, device.type, None)

    @classmethod
    def wanted(cls, recipe: Any, device: Any) -> "GlobalRngCheck | None":
        import os

        return cls(device) if os.environ.get(CHECK_GLOBAL_RNG) == "1" and recipe.sample_seeds else None

    def state(self) -> list[Any]:
        states = [self.torch.random.get_rng_state()]
        if self.device_module is not None and hasattr(self.device_module, "get_rng_state"):
            states.append(self.device_module.get_rng_state())
        return states

    def check(self, step: int, before: list[Any]) -> None:
        after = self.state()
        if any(not self.torch.equal(a, b) for a, b in zip(before, after)):
            where = "the CPU's" if not self.torch.equal(before[0], after[0]) else "the accelerator's"
            raise StageError(
                f"global rng: step {step}'s forward and backward drew from torch's global RNG ({where}: torch.randn/rand/randint, "
                "or dropout with p > 0, without a generator): a recipe with sample_seeds draws each sample's randomness from a "
                "generator seeded with batch['sample_seeds'], or 2 processes do not train as 1"
            )
