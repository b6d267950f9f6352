"""The CPU: always available; collectives over gloo."""

from __future__ import annotations

import os
import platform
import resource
import sys
from typing import Any

from mmcore import hookimpl
from mmcore.framework.accelerator import Accelerator


class CPUAccelerator(Accelerator):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def supports_bf16(self) -> bool:
        # bf16 matmuls run on every x86-64/arm64 CPU torch supports (emulated where slow);
        # the train engine still defaults to fp32 on CPU for speed (precision: auto).
        return True

    def peak_memory_bytes(self) -> int:
        # ru_maxrss: kilobytes on Linux, bytes on macOS; a high-water mark that cannot be reset.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)

    def describe(self) -> dict[str, Any]:
        return {
            "available": True,
            "count": 1,
            "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
        }


@hookimpl
def mmcore_register_accelerators(register):
    register(CPUAccelerator())
