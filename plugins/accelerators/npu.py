"""Ascend NPUs through torch_npu; collectives over HCCL.

torch_npu is imported only when it is present *and* its runtime (CANN) is: importing it
without CANN fails, and once installed it even breaks ``import torch`` unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Availability is first probed without importing it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from mmcore import hookimpl
from mmcore.framework.accelerator import Accelerator


def _cann_present() -> bool:
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    candidates = [home] if home else []
    candidates.append("/usr/local/Ascend/ascend-toolkit/latest")
    return any(c and os.path.isdir(c) for c in candidates)


class NPUAccelerator(Accelerator):
    name = "npu"
    device_type = "npu"
    dist_backend = "cpu:gloo,npu:hccl"
    priority = 30

    def __init__(self) -> None:
        self._available: bool | None = None
        self._why: str = ""

    def _torch_npu(self) -> Any:
        import torch  # noqa: F401  (torch first: torch_npu patches it)
        import torch_npu  # type: ignore[import-not-found]

        return torch_npu

    def is_available(self) -> bool:
        if self._available is None:
            self._available = False
            if importlib.util.find_spec("torch_npu") is None:
                self._why = "torch_npu is not installed"
            elif not _cann_present():
                self._why = "torch_npu is installed but CANN is not (set ASCEND_HOME_PATH / source set_env.sh)"
            else:
                try:
                    import torch

                    self._torch_npu()
                    self._available = bool(torch.npu.is_available())  # type: ignore[attr-defined]
                    self._why = "" if self._available else "torch.npu.is_available() is False"
                except Exception as exc:  # broken CANN installs raise all kinds of errors
                    self._why = f"import torch_npu failed: {exc}"
        return self._available

    @property
    def why_unavailable(self) -> str:
        self.is_available()
        return self._why

    def device_count(self) -> int:
        import torch

        return torch.npu.device_count() if self.is_available() else 0  # type: ignore[attr-defined]

    def set_device(self, local_rank: int = 0) -> None:
        import torch

        torch.npu.set_device(local_rank % max(self.device_count(), 1))  # type: ignore[attr-defined]

    def supports_bf16(self) -> bool:
        return self.is_available()

    def synchronize(self) -> None:
        import torch

        torch.npu.synchronize()  # type: ignore[attr-defined]

    def reset_peak_memory(self) -> None:
        import torch

        torch.npu.reset_peak_memory_stats()  # type: ignore[attr-defined]

    def peak_memory_bytes(self) -> int:
        import torch

        return int(torch.npu.max_memory_allocated())  # type: ignore[attr-defined]

    def describe(self) -> dict[str, Any]:
        if not self.is_available():
            return {"available": False, "count": 0, "why": self.why_unavailable}
        import torch

        return {
            "available": True,
            "count": self.device_count(),
            "devices": [torch.npu.get_device_name(i) for i in range(self.device_count())],  # type: ignore[attr-defined]
            "torch_npu": self._torch_npu().__version__,
        }


@hookimpl
def mmcore_register_accelerators(register):
    register(NPUAccelerator())
