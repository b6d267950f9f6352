"""megatron-core 0.16 on the CPU accelerator: a small, version-pinned compatibility layer.

megatron-core asks CUDA for the current device, synchronises it and creates a few tensors with
``device="cuda"``, and keeps its model-parallel RNG as CUDA generator states. On a machine
without CUDA (tests, a laptop) :func:`activate` gives those modules a ``torch`` whose ``cuda``
answers for the CPU: ``current_device()`` is ``"cpu"``, ``synchronize()`` does nothing, tensor
factories asked for ``cuda`` make CPU tensors, and the RNG tracker keeps CPU generator states.
Only the modules listed in :data:`MODULES` see it, only after :func:`activate`, which refuses
any megatron-core other than the minor version it was written for; with CUDA present it is
never activated. Megatron's distributed optimizer, its gradient clipping and the Transformer
Engine layers are not covered (they need CUDA): those run in the GPU script.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
import warnings
from typing import Any, Iterator

from mmcore.errors import StageError

#: the megatron-core modules that address CUDA on the paths mmcore runs (forward, backward,
#: tensor-parallel collectives, the RNG tracker)
MODULES = (
    "megatron.core.utils",
    "megatron.core.transformer.utils",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.cross_entropy",
    "megatron.core.tensor_parallel.data",
    # pipeline stages: the schedules and their point-to-point transfers
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    # dist_checkpointing: the checkpoint format that reshards at load
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.tensor_aware_state_dict",
    "megatron.core.dist_checkpointing.strategies.async_utils",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "megatron.core.dist_checkpointing.strategies.fully_parallel",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
    "megatron.core.dist_checkpointing.strategies.torch",
)

_FACTORIES = frozenset({"empty", "zeros", "ones", "full", "tensor", "arange", "randn", "rand", "empty_like", "zeros_like", "ones_like", "as_tensor"})
_active = False


def _on_cpu(device: Any) -> Any:
    if isinstance(device, int) or (device is not None and str(device).startswith("cuda")):
        return "cpu"
    return device


class _CpuCuda(types.ModuleType):
    """``torch.cuda`` as the listed modules see it: the CPU in CUDA's place."""

    def __init__(self) -> None:
        super().__init__("torch.cuda (mmcore CPU layer)")

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 0

    @staticmethod
    def get_rng_state(*args: Any, **kwargs: Any) -> Any:
        import torch

        return torch.get_rng_state()

    @staticmethod
    def manual_seed(seed: int) -> Any:
        import torch

        return torch.manual_seed(seed)


class _CpuTorch(types.ModuleType):
    """``torch`` as the listed modules see it: ``cuda`` is :class:`_CpuCuda`, factories asked
    for a CUDA device make CPU tensors; everything else is torch's own."""

    def __init__(self) -> None:
        super().__init__("torch (mmcore CPU layer)")
        self.cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        import torch

        value = getattr(torch, name)
        if name not in _FACTORIES:
            return value

        @functools.wraps(value)
        def factory(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            return value(*args, **kwargs)

        return factory


def activate() -> None:
    """Point the listed megatron-core modules at the CPU (idempotent). A megatron-core other
    than the tested minor version is a one-line error: the layer patches what that version does."""
    global _active
    if _active:
        return
    import torch

    from mmcore.backends.megatron import status

    usable, why = status()
    if not usable:
        raise StageError(f"parallel.backend=megatron: {why}")
    if torch.cuda.is_available():
        return  # real CUDA: megatron-core runs as it is
    # its tensor-parallel linears advise a CUDA stream setting, once per process: none here
    warnings.filterwarnings("ignore", message=r".*CUDA_DEVICE_MAX_CONNECTIONS", category=UserWarning)
    cpu_torch = _CpuTorch()
    for name in MODULES:
        importlib.import_module(name).torch = cpu_torch  # type: ignore[attr-defined]
    rng = importlib.import_module("megatron.core.tensor_parallel.random")
    rng._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()  # type: ignore[attr-defined]
    rng._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)  # type: ignore[attr-defined]
    _active = True


@contextlib.contextmanager
def tensor_cuda_stays() -> Iterator[None]:
    """While building a model: ``Tensor.cuda()`` gives the tensor itself on a machine without
    CUDA. megatron-core 0.16 moves a tied output layer's copy on the last pipeline stage to CUDA
    (``weight.data.cuda()``) to all-reduce it with the embedding as the model is built; a method
    call no module swap can reach. Nothing else runs inside."""
    import torch

    if not _active:
        yield
        return
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]


__all__ = ["MODULES", "activate", "tensor_cuda_stays"]
