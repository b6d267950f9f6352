"""bf16 compute with fp32 weights on the megatron backend (``training.precision: bf16``).

Megatron's own mixed precision keeps the model in bf16 and fp32 "main" copies of the weights in
its distributed optimizer, which needs CUDA. :class:`Bf16Compute` does the same on any device
and keeps the engine's promises unchanged: outside a step the parameters are the fp32 weights
(the optimizer, the checkpoints, the gather for export see only those); inside
:meth:`Bf16Compute.step` each parameter holds a bf16 copy, so every layer computes in bf16
with operands of one dtype, as Megatron's layers assume (its sequence-parallel reduce-scatter
and pipeline transfers take the activations' dtype to be the weights'), and each micro-batch's
bf16 gradient is added to an fp32 sum as soon as autograd has it. On leaving, the fp32 weights
come back with those sums as their gradients: the data-parallel sum, the clip and AdamW run in
fp32, as the FSDP2 loop's mixed-precision policy does.

(torch autocast was tried first: its bf16 matrix multiplies on fp32 weights give megatron-core
layers operands of two dtypes, which its sequence-parallel backward and its pipeline transfers
do not handle.)
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator


class Bf16Compute:
    """The parameters of a rank's model chunks, switched to bf16 for a step's compute.

    Args:
        parameters: every parameter of the rank's model (frozen ones too: they compute in bf16
            as well); those that require a gradient get an fp32 one.
        enabled: False: :meth:`step` changes nothing (fp32 compute).
    """

    def __init__(self, parameters: Iterable[Any], enabled: bool = True) -> None:
        self.parameters = list(parameters) if enabled else []
        self.enabled = enabled
        self._sums: dict[int, Any] = {}
        for parameter in self.parameters:
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self._add_to_sum)

    def _add_to_sum(self, parameter: Any) -> None:
        # a micro-batch's bf16 gradient, summed in fp32 (autograd would sum them in bf16)
        kept = self._sums.get(id(parameter))
        self._sums[id(parameter)] = parameter.grad.float() if kept is None else kept.add_(parameter.grad)
        parameter.grad = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Inside: the parameters are bf16 copies of the fp32 weights. After: the fp32 weights
        again, each with the fp32 sum of the gradients computed inside (none if none was)."""
        import torch

        if not self.enabled:
            yield
            return
        weights = [parameter.data for parameter in self.parameters]
        for parameter, weight in zip(self.parameters, weights):
            parameter.data = weight.to(torch.bfloat16)
        try:
            yield
        finally:
            for parameter, weight in zip(self.parameters, weights):
                parameter.data = weight
                parameter.grad = self._sums.pop(id(parameter), None)
            self._sums.clear()


__all__ = ["Bf16Compute"]
