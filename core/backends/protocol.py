"""The distributed backend of the train engine: what :func:`mmcore.train.loop.run_training` asks of it.

One loop (setup, step, checkpoint, log) runs every backend; a backend (``parallel.backend``:
``fsdp2``, ``megatron``) decides only where the model lives and how it computes. The registry
makes one backend object per stage (``BackendSpec.factory``); the loop then calls, in order:

1. :meth:`Backend.setup` once: process groups, this rank's model with its weights, precision;
2. :meth:`Backend.start` once, after the loop built the optimizer, scheduler, sampler and
   moving average: the training's random draws start here, resumed from a checkpoint or not;
3. per step :meth:`Backend.forward_backward`, :meth:`Backend.clip_gradients`,
   :meth:`Backend.reduce_loss`; every ``training.checkpoint_every`` steps and at the end
   :meth:`Backend.save`; at step 0, every ``training.eval_every`` steps and at the end
   :meth:`Backend.evaluate`;
4. :meth:`Backend.finish` once after the last checkpoint (the end-of-training outputs), then
   :meth:`Backend.close`.

The recipe a backend gets is generic (:class:`mmcore.train.TrainRecipe`); a backend that needs
more of it defines a protocol of its own (a ``runtime_checkable`` :class:`typing.Protocol`),
checks the recipe with ``isinstance`` in :meth:`Backend.setup` and refuses, in one line, a recipe
that is not one: megatron asks for :class:`mmcore.backends.megatron.family.MegatronRecipe`.

What every backend shares stays in the loop: the sampler and the planned steps, the token
counts, the optimizer (:func:`mmcore.train.optim.build_optimizer` over :attr:`Prepared.optimizer_params`),
the scheduler, the moving average over the trained parameters, the non-finite guards, the
metrics, the progress line and the crash points.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    from mmcore.framework.context import StageContext
    from mmcore.train.ema import MovingAverage
    from mmcore.run.rundir import Manifest
    from mmcore.train.loop import TrainRecipe


@dataclass
class Prepared:
    """What :meth:`Backend.setup` hands the loop.

    Attributes:
        model: this rank's model, weights loaded (FSDP2: the sharded root; megatron: the list of
            its model chunks). The loop switches it between ``train()`` and ``eval()`` and takes
            the moving average over its ``named_parameters()`` that require gradients.
        trained: this rank's parameters that train (empty on a megatron stage that trains
            nothing): what the non-finite guard checks before a checkpoint.
        optimizer_params: what :func:`mmcore.train.optim.build_optimizer` gets (the parameters, or one
            group of them where the list may be empty).
        frozen: how many parameter names ``training.freeze`` froze (``frozen_parameters``).
        bf16: whether the steps compute in bf16 (``training.precision``), for the result.
        data_rank, data_ranks: this process's data-parallel replica and how many there are:
            what the sampler cuts the data by (megatron: processes / (TP x PP)).
        data_group: the group the step's loss tokens and tower work are summed over (None: the
            world, when there is more than one process).
        fills: whether ranks whose micro-batches lack a media kind collate fillers
            (``TrainRecipe.fill``) so that every rank calls the same towers.
        finite_group: the group the "weights are finite" check before a checkpoint reduces over
            (None: the world, when there is more than one process).
    """

    model: Any
    trained: list[Any]
    optimizer_params: Sequence[Any]
    frozen: int
    bf16: bool
    data_rank: int
    data_ranks: int
    data_group: Any = None
    fills: bool = True
    finite_group: Any = None


@dataclass
class Resumed:
    """What :meth:`Backend.start` restored: the step and that step's loss (NaN: none saved), and
    ``how``, said after "resumed from step N" (empty, or why another checkpoint or layout)."""

    step: int
    loss: float
    how: str = ""


@dataclass
class Finished:
    """What :meth:`Backend.finish` adds to the stage's result: its ``outputs`` (name -> path in
    the stage folder; ``checkpoint`` is what export reads), ``metrics`` and ``notes``, and
    ``where``, appended to the "final loss" line (the backend's layout)."""

    outputs: dict[str, str]
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    where: str = ""


class Backend(Protocol):
    """A distributed backend, as the train loop drives it (the order is the module's)."""

    name: str

    def setup(self, ctx: "StageContext", upstream: Mapping[str, "Manifest"], recipe: "TrainRecipe", resume_from: Path | None) -> Prepared:
        """Ready this rank to train, before the loop builds anything else.

        Creates the process groups (and the device mesh) this backend needs, seeds the RNGs,
        builds the recipe's model (its part on this rank), applies ``training.freeze``,
        ``training.lora``, ``training.recompute`` and the precision policy, shards it and
        loads each rank's part of the weights (convert's checkpoint; with ``resume_from``, the
        newest complete checkpoint to resume from, the weights it will restore are not read).
        Refuses (``StageError``, one line) what the backend does not do, and a run that would
        train nothing."""
        ...

    def start(self, checkpoint: Path | None, optimizer: Any, scheduler: Any, sampler: Any, ema: "MovingAverage | None") -> Resumed | None:
        """Called once before the first step, when the optimizer, scheduler, sampler and moving
        average exist. With ``checkpoint``: restore all of them, the model and the RNG states
        in place, and return where the run resumes; without: return None. Either way the
        training's random draws start from here."""
        ...

    def forward_backward(self, batches: Sequence[dict[str, Any]], total_tokens: float) -> tuple[Any, float]:
        """One step's micro-batches (this rank's, on the CPU as collated) forward and backward,
        the gradients those of (the summed loss of every rank's micro-batches) / ``total_tokens``
        (the step's loss units over all data-parallel ranks). Returns (this rank's summed loss
        (a float or a 0-d tensor), the FLOPs this process ran, 0 without ``TrainRecipe.flops``)."""
        ...

    def clip_gradients(self, max_norm: float | None) -> float:
        """Finish the step's gradients (the sums across ranks the backend leaves to the end),
        clip them to ``max_norm`` (``training.max_grad_norm``; None: no clipping) by their norm
        over the whole model, and return that norm before clipping: the same on every rank."""
        ...

    def reduce_loss(self, loss_sum: Any) -> tuple[float, bool]:
        """The step's summed loss over every data-parallel rank (what :meth:`forward_backward`
        returned on each), and whether every process of the world saw it finite: the loop's
        update, skip or stop is then the same on every rank."""
        ...

    def save(self, root: Path, step: int, optimizer: Any, scheduler: Any, sampler: Any, loss: float, ema: "MovingAverage | None") -> None:
        """Write the checkpoint ``root/step-N`` (``step``: the steps done; ``loss``: the last
        finite step loss) by the engine's protocol (:func:`mmcore.checkpoint.training.commit_checkpoint`):
        model, optimizer and moving average in the backend's format, the scheduler, the data
        position and the RNG states; what :meth:`start` restores."""
        ...

    def evaluate(self, ctx: "StageContext", recipe: "TrainRecipe", step: int) -> dict[str, float]:
        """Held-out metrics at ``step`` (0, every ``training.eval_every`` steps, the end), on
        every rank, without gradients; the model is back in training mode after. Empty when the
        pack has no held-out evaluation on this backend."""
        ...

    def finish(self, root: Path, ema: "MovingAverage | None") -> Finished:
        """After the last checkpoint (``root/latest``): write the end-of-training outputs
        (FSDP2: the moving average beside the checkpoints; megatron: the trained weights, the
        LoRA adapters, their averages) and say what they are."""
        ...

    def close(self) -> None:
        """Release what :meth:`setup` created for this stage (a process group of its own)."""
        ...


__all__ = ["Backend", "Prepared", "Resumed", "Finished"]
