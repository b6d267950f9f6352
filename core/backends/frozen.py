"""A frozen copy of a model's weights kept beside it: GRPO's reference for full fine-tuning.

With LoRA the reference costs nothing (the base with the adapters off); a fully fine-tuned model
has no such base left, so :class:`FrozenWeights` keeps the trained parameters as they were at
one step (a frozen one is the reference's already):
each process only its own shards (a sharded model's, so the copy costs what the model's
parameters cost per process, not a whole model). For a forward of the reference the copy is
swapped into the model's own parameter storage and swapped back after
(:meth:`FrozenWeights.swapped_in`): no second module, no second set of FSDP hooks, and the
gathering is FSDP's own. The copy is written once as a model checkpoint (reshardable DCP, what
:func:`~mmcore.checkpoint.training.load_converted` reads), so a resumed run, at any number of
processes, has the same reference.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def _local(param: Any) -> Any:
    """The storage this process holds of a parameter: a DTensor's local shard, else itself."""
    return param.to_local() if hasattr(param, "to_local") else param


@contextmanager
def own_shards(model: Any) -> Iterator[None]:
    """Inside :func:`mmcore.backends.fsdp2.local_forwards` (every parameter gathered whole),
    the block sees the model's parameters as each process's shards again; they are gathered
    once more on leaving. Every process enters, in the same order. A model that is not sharded
    is left as it is."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in sharded:
        module.reshard()
    try:
        yield
    finally:
        for module in sharded:
            module.unshard()


class FrozenWeights:
    """This process's part of a model's parameters at one step (name -> tensor)."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors

    @classmethod
    def take(cls, model: Any, folder: Path, world: Any) -> "FrozenWeights":
        """The model's parameters now, written to ``folder`` as well (a model checkpoint)."""
        import torch

        from mmcore.checkpoint.training import save_average

        with own_shards(model), torch.no_grad():
            save_average(folder, model, {}, world)  # no average: the model's own weights
            return cls({name: _local(p).detach().clone() for name, p in model.named_parameters() if p.requires_grad})

    @classmethod
    def load(cls, model: Any, folder: Path, world: Any) -> "FrozenWeights":
        """The copy :meth:`take` wrote to ``folder``, cut into this process's shards as the model is."""
        import torch
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        from mmcore.checkpoint import safe_dcp

        with own_shards(model), torch.no_grad():
            names = [name for name, p in model.named_parameters() if p.requires_grad]
            state = {name: value.detach().clone() for name, value in get_model_state_dict(model).items() if name in set(names)}
            safe_dcp.load({"model": state}, folder, distributed=world.distributed)
            return cls({name: _local(state[name]) for name in names})

    @contextmanager
    def swapped_in(self, model: Any) -> Iterator[None]:
        """Inside the block the model computes with the frozen copy (inside ``local_forwards``,
        as the rollout runs); its own weights are back, bit for bit, after it."""
        with own_shards(model):
            self._swap(model)
        try:
            yield
        finally:
            with own_shards(model):
                self._swap(model)

    def _swap(self, model: Any) -> None:
        import torch

        with torch.no_grad():
            for name, param in model.named_parameters():
                if name not in self.tensors:  # frozen: the reference's already
                    continue
                mine, kept = _local(param), self.tensors[name]
                held = mine.clone()
                mine.copy_(kept)
                kept.copy_(held)


#: the stage folder's copy of full fine-tuning's GRPO reference weights
REFERENCE = "grpo-reference"


class GrpoReference:
    """GRPO's reference policy, for the KL penalty (``training.grpo.beta`` > 0), computed in the
    rollout (inside :func:`mmcore.backends.fsdp2.local_forwards`): with LoRA the base with the
    adapters off; fully fine-tuned, the weights of the first rollout (after the warm-up), a
    :class:`FrozenWeights` copy of each process's shards taken then and read back from
    ``grpo-reference/`` in the stage folder by a resumed run."""

    def __init__(self, lora: bool, stage_dir: Path, world: Any) -> None:
        self.lora, self.folder, self.world = lora, stage_dir / REFERENCE, world
        self.frozen: FrozenWeights | None = None

    def of(self, model: Any, first_rollout: bool) -> Any:
        """The block in which ``model`` computes as the reference (``first_rollout``: this is
        the step whose weights become it)."""
        if self.lora:
            from mmcore.train.lora import adapters_disabled

            return adapters_disabled(model)
        if self.frozen is None:
            from mmcore.errors import StageError

            if first_rollout:
                self.frozen = FrozenWeights.take(model, self.folder, self.world)
            elif not (self.folder / ".metadata").is_file():
                raise StageError(f"{self.folder}: the GRPO reference (the weights of the first rollout) is missing, so this run cannot resume with training.grpo.beta > 0; train again from the start")
            else:
                self.frozen = FrozenWeights.load(model, self.folder, self.world)
        return self.frozen.swapped_in(model)


__all__ = ["FrozenWeights", "GrpoReference", "REFERENCE", "own_shards"]
