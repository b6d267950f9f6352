"""mmcore: a plugin framework for the whole training pipeline of multimodal models.

What a pack needs is importable from here without importing torch::

    from mmcore import hookimpl, PackSpec, Stage, StageResult, StageContext

What a pack may import from mmcore at all is listed, versioned, in :mod:`mmcore.sdk`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from mmcore._version import __version__
from mmcore.errors import ConfigError, MmcoreError, PackError, StageError, UsageError
from mmcore.pack import STAGES, PackSpec, Stage, StageResult

#: Marks a function as an implementation of an mmcore hook (see :mod:`mmcore.hookspecs`).
hookimpl = pluggy.HookimplMarker("mmcore")

if TYPE_CHECKING:
    from mmcore.config import RunConfig
    from mmcore.context import StageContext, WorldInfo
    from mmcore.registry import BackendSpec, KernelSpec
    from mmcore.rundir import Manifest

_LAZY = {
    "RunConfig": "mmcore.config",
    "StageContext": "mmcore.context",
    "WorldInfo": "mmcore.context",
    "KernelSpec": "mmcore.registry",
    "BackendSpec": "mmcore.registry",
    "Manifest": "mmcore.rundir",
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
    "Manifest",
    "MmcoreError",
    "ConfigError",
    "UsageError",
    "PackError",
    "StageError",
]
