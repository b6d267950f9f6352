"""The megatron-core backend (``parallel.backend: megatron``): tensor and pipeline parallelism
for families whose pack gives a :class:`mmcore.backends.megatron.engine.MegatronFamily`. Registered
always; megatron-core itself is the optional extra ``mmcore[megatron]``, imported only when a
run uses the backend (``mmcore doctor`` says whether it is usable)."""

from __future__ import annotations

from mmcore import hookimpl
from mmcore.framework.registry import BackendSpec


@hookimpl
def mmcore_register_backends(register):
    register(
        BackendSpec(
            "megatron",
            "mmcore.backends.megatron.engine:MegatronBackend",
            summary="megatron-core: tensor (parallel.tensor_parallel) and pipeline (parallel.pipeline_parallel) parallelism, dist_checkpointing that reshards on load",
        )
    )
