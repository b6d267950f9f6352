"""NVIDIA (and ROCm) GPUs through torch.cuda; collectives over NCCL, CPU tensors over gloo."""

from __future__ import annotations

from typing import Any

from mmcore import hookimpl
from mmcore.framework.accelerator import Accelerator


class CUDAAccelerator(Accelerator):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "cpu:gloo,cuda:nccl"
    priority = 20

    def is_available(self) -> bool:
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count() if self.is_available() else 0

    def set_device(self, local_rank: int = 0) -> None:
        import torch

        torch.cuda.set_device(local_rank % max(self.device_count(), 1))

    def supports_bf16(self) -> bool:
        import torch

        return self.is_available() and torch.cuda.is_bf16_supported()

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated())

    def describe(self) -> dict[str, Any]:
        if not self.is_available():
            return {"available": False, "count": 0}
        import torch

        return {
            "available": True,
            "count": self.device_count(),
            "devices": [torch.cuda.get_device_name(i) for i in range(self.device_count())],
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        }


@hookimpl
def mmcore_register_accelerators(register):
    register(CUDAAccelerator())
