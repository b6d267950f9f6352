"""The device abstraction every accelerator plugin implements.

Methods import their device library lazily: ``is_available`` must never break on a machine
without the device (torch_npu installed without CANN even breaks ``import torch``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Accelerator:
    """One kind of device. Subclasses set the class attributes and override what differs.

    Attributes:
        name: The name users select (``--device cuda``, ``run.device: cuda``).
        device_type: The torch device type (``"cpu"``, ``"cuda"``, ``"npu"``).
        dist_backend: The torch.distributed backend for collectives on this device.
        priority: Order for ``run.device: auto``: the available accelerator with the
            highest priority is chosen.
    """

    name: str = ""
    device_type: str = ""
    dist_backend: str = "gloo"
    priority: int = 0

    def is_available(self) -> bool:
        raise NotImplementedError

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def device(self, local_rank: int = 0) -> torch.device:
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, local_rank % max(self.device_count(), 1))

    def set_device(self, local_rank: int = 0) -> None:
        """Make ``local_rank``'s device current for this process (no-op on CPU)."""

    def supports_bf16(self) -> bool:
        return False

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on CPU)."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory measurement."""

    def peak_memory_bytes(self) -> int:
        """Peak memory used by this process on the device since the last reset."""
        return 0

    def peak_flops(self) -> float | None:
        """Peak dense bf16 FLOP/s of one device, for the MFU metric; None where unknown (the
        CPU). ``MMCORE_PEAK_TFLOPS`` overrides it (a device not in the table, a clock limit)."""
        override = os.environ.get("MMCORE_PEAK_TFLOPS")
        if override:
            return float(override) * 1e12
        names = self.describe().get("devices") or []
        return peak_of(str(names[0])) if names else None

    def describe(self) -> dict[str, Any]:
        """Facts for ``mmcore doctor`` and manifests: device names, driver/runtime versions."""
        return {"available": self.is_available(), "count": self.device_count()}

    def __repr__(self) -> str:
        return f"<Accelerator {self.name}>"


#: Dense (no sparsity) bf16 tensor peaks from the vendors' data sheets, by a substring of the
#: device name torch reports; the first match wins, so longer names come first.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("B200", 2250e12),
    ("Ascend910B2", 376e12),
    ("Ascend910B", 313e12),  # 910B3/B4
    ("Ascend910C", 752e12),  # two 910B2-class dies
)


def peak_of(device_name: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower().replace(" ", "") in device_name.lower().replace(" ", ""):
            return flops
    return None
