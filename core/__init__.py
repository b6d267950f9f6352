"""mmcore: a plugin framework for the whole training pipeline of multimodal models.

What a pack needs is importable from here without importing torch::

    from mmcore import hookimpl, PackSpec, Stage, StageResult, StageContext

What a pack may import from mmcore at all is listed, versioned, in :mod:`mmcore.sdk`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

__version__ = "0.1.0"

# old module paths (before the folders) answer with the moved modules until SDK 2.0
from mmcore.framework.moved import install as _install_moved  # noqa: E402

_install_moved()

from mmcore.errors import ConfigError, MmcoreError, PackError, StageError, UsageError
from mmcore.framework.pack import STAGES, PackSpec, Stage, StageResult

#: Marks a function as an implementation of an mmcore hook (see :mod:`mmcore.framework.hookspecs`).
hookimpl = pluggy.HookimplMarker("mmcore")

if TYPE_CHECKING:
    from mmcore.config import RunConfig
    from mmcore.framework.context import StageContext, WorldInfo
    from mmcore.framework.registry import BackendSpec, KernelSpec, RewardSpec
    from mmcore.run.rundir import Manifest

_LAZY = {
    "RunConfig": "mmcore.config",
    "StageContext": "mmcore.framework.context",
    "WorldInfo": "mmcore.framework.context",
    "KernelSpec": "mmcore.framework.registry",
    "BackendSpec": "mmcore.framework.registry",
    "RewardSpec": "mmcore.framework.registry",
    "Manifest": "mmcore.run.rundir",
    # the stage outputs, file helpers and crash points every pack uses
    "CHECKPOINT": "mmcore.framework.pack",
    "DATASET": "mmcore.framework.pack",
    "FEATURES": "mmcore.framework.pack",
    "MODEL": "mmcore.framework.pack",
    "ON_DEMAND": "mmcore.framework.pack",
    "RESULTS": "mmcore.framework.pack",
    "STAGE_OUTPUTS": "mmcore.framework.pack",
    "atomic_write_json": "mmcore.framework.files",
    "read_json_object": "mmcore.framework.files",
    "crash_point": "mmcore.framework.faults",
    "missing_dependency": "mmcore.errors",
    "sha256_file": "mmcore.framework.files",
    "sha256_json": "mmcore.framework.files",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mmcore' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "__version__",
    "hookimpl",
    "STAGES",
    "PackSpec",
    "Stage",
    "StageResult",
    "StageContext",
    "WorldInfo",
    "RunConfig",
    "KernelSpec",
    "BackendSpec",
    "RewardSpec",
    "Manifest",
    "MmcoreError",
    "ConfigError",
    "UsageError",
    "PackError",
    "StageError",
]
