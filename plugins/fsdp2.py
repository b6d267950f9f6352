"""The FSDP2 distributed backend (torch.distributed ``fully_shard``).

Shards each module the recipe names (decoder layers, vision blocks), then the root; bf16
parameters with fp32 gradient reduction where the device has bf16. On one process the model
is only moved to the device: sharding over one rank buys nothing.
"""

from __future__ import annotations

from typing import Any

from mmcore import hookimpl
from mmcore.registry import BackendSpec


class FSDP2Backend:
    name = "fsdp2"

    def handles_precision(self, world: Any) -> bool:
        return bool(world.distributed)

    def prepare(self, model: Any, shard_modules: list[Any], *, device: Any, bf16: bool, world: Any) -> Any:
        import torch

        model = model.to(device)
        if not world.distributed:
            return model
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        for module in shard_modules:
            fully_shard(module, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model


@hookimpl
def mmcore_register_backends(register):
    register(BackendSpec("fsdp2", "mmcore_plugins.fsdp2:FSDP2Backend", summary="PyTorch FSDP2 (fully_shard), reshardable DCP checkpoints"))
