"""The FSDP2 distributed backend (torch.distributed ``fully_shard``), registered as
``parallel.backend: fsdp2``; the train loop's side of it is :mod:`mmcore.backends.fsdp2`."""

from __future__ import annotations

from mmcore import hookimpl
from mmcore.backends.fsdp2 import FSDP2Backend, root_output_without_views
from mmcore.framework.registry import BackendSpec


@hookimpl
def mmcore_register_backends(register):
    register(BackendSpec("fsdp2", "mmcore_plugins.fsdp2:FSDP2Backend", summary="PyTorch FSDP2 (fully_shard; HSDP with parallel.replicate), reshardable DCP checkpoints"))


__all__ = ["FSDP2Backend", "root_output_without_views"]
