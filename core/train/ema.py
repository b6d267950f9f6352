"""An exponential moving average (EMA) of the trained weights, kept beside them by the train engine.

Diffusion models are sampled from an average of their recent weights rather than the last
step's (Stable Diffusion, Wan and FLUX trainers keep one): the average smooths the noise of
single steps. ``training.ema`` is its decay. The average of each trained parameter is a tensor
of the same kind and placement (an FSDP2 shard stays a shard: memory per rank grows by one
copy of this rank's trained shards), updated after every optimizer step as diffusers'
``EMAModel`` updates it: the decay of update ``k`` (0 for the first) is
``min(training.ema, (1 + k) / (10 + k))``, so a short run is not held back by its start.

Training checkpoints hold the average under ``ema.<name>`` (resuming restores it, bit for bit);
the end of training writes it as a whole model checkpoint (``<train>/checkpoints/ema``: the average where
a parameter trained, the weights as they are where one did not), which export reads by default
(``export.weights``).
"""

from __future__ import annotations

from typing import Any, Iterable

#: the train stage's output (and its folder) holding the average as a model checkpoint
EMA_OUTPUT = "ema"
#: where a backend keeps LoRA adapters apart from merged weights (megatron): the train stage's
#: output (and folder) holding the average of the adapters in PEFT's format, beside ``adapter``
EMA_ADAPTER = "ema_adapter"


def decay_at(decay: float, update: int) -> float:
    """The decay of the ``update``-th update (0-based): diffusers' ``EMAModel`` warm-up."""
    return 0.0 if update <= 0 else min(decay, (1 + update) / (10 + update))


class MovingAverage:
    """The average of named trained parameters (plain tensors or DTensor shards)."""

    def __init__(self, named_parameters: Iterable[tuple[str, Any]], decay: float) -> None:
        self.decay = decay
        self.parameters = dict(named_parameters)
        self.average = {name: p.detach().clone() for name, p in self.parameters.items()}

    def update(self, step: int) -> None:
        """Fold in the weights after optimizer step ``step`` (1-based, the engine's ``done``)."""
        import torch

        weight = 1.0 - decay_at(self.decay, step - 1)
        with torch.no_grad():
            for name, average in self.average.items():
                average.lerp_(self.parameters[name].detach(), weight)

    def state_dict(self) -> dict[str, Any]:
        return self.average


__all__ = ["EMA_OUTPUT", "MovingAverage", "decay_at"]
