"""Old module paths (SDK 1.0-1.17, a flat ``mmcore/``) that keep working until SDK 2.0.

Core v2 put every module in a folder named for its job (``mmcore.hub`` is now
:mod:`mmcore.engines.download`). A pack or script written before still imports the old path:
:func:`install` adds an import finder that answers an old name with the *same module object* as
its new one (not a copy: a test that patches ``mmcore.hub.download_model`` patches what the
engine calls). New code imports the new paths; packs import the façade (:mod:`mmcore.sdk`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

#: old module -> its new module (the names in it are unchanged)
MOVED: dict[str, str] = {
    # framework
    "mmcore.pack": "mmcore.framework.pack",
    "mmcore.hookspecs": "mmcore.framework.hookspecs",
    "mmcore.stages": "mmcore.framework.stages",
    "mmcore.plugins": "mmcore.framework.plugins",
    "mmcore.registry": "mmcore.framework.registry",
    "mmcore.context": "mmcore.framework.context",
    "mmcore.accelerator": "mmcore.framework.accelerator",
    "mmcore.versions": "mmcore.framework.versions",
    "mmcore.conformance_record": "mmcore.framework.conformance_record",
    "mmcore.io": "mmcore.framework.files",
    "mmcore.console": "mmcore.framework.console",
    "mmcore.faults": "mmcore.framework.faults",
    "mmcore.tracking": "mmcore.framework.tracking",
    # config
    "mmcore.config_errors": "mmcore.config.errors",
    "mmcore.config_reference": "mmcore.config.reference",
    "mmcore.knobs": "mmcore.config.knobs",
    # run
    "mmcore.runner": "mmcore.run.runner",
    "mmcore.session": "mmcore.run.session",
    "mmcore.rundir": "mmcore.run.rundir",
    "mmcore.runlock": "mmcore.run.lock",
    "mmcore.nodes": "mmcore.run.nodes",
    "mmcore.launch": "mmcore.run.launch",
    "mmcore.torchrun": "mmcore.run.torchrun",
    "mmcore.worker": "mmcore.run.worker",
    "mmcore.worker_errors": "mmcore.run.worker_errors",
    "mmcore.lifeline": "mmcore.run.lifeline",
    "mmcore.preflight": "mmcore.run.preflight",
    "mmcore.progress": "mmcore.run.status",
    "mmcore.envs": "mmcore.run.envs",
    "mmcore.env_requirements": "mmcore.run.env_requirements",
    # cli
    "mmcore.cli_inspect": "mmcore.cli.inspect_commands",
    "mmcore.doctor": "mmcore.cli.doctor",
    "mmcore.newpack": "mmcore.cli.newpack",
    # engines
    "mmcore.hub": "mmcore.engines.download",
    "mmcore.coverage": "mmcore.engines.coverage",
    "mmcore.adapters": "mmcore.engines.state_dict",
    "mmcore.export": "mmcore.engines.export",
    "mmcore.evaluation": "mmcore.engines.evaluation",
    "mmcore.generation": "mmcore.engines.generation",
    "mmcore.infer": "mmcore.engines.infer",
    "mmcore.report": "mmcore.engines.report",
    "mmcore.tiny": "mmcore.engines.tiny",
    "mmcore.convert": "mmcore.engines.convert",
    # checkpoint
    "mmcore.checkpointing": "mmcore.checkpoint.training",
    "mmcore.safe_dcp": "mmcore.checkpoint.safe_dcp",
    "mmcore.safetensors_io": "mmcore.checkpoint.safetensors_files",
    "mmcore.sharded_load": "mmcore.checkpoint.sharded_load",
    # train
    "mmcore.optim": "mmcore.train.optim",
    "mmcore.sampler": "mmcore.train.sampler",
    "mmcore.recompute": "mmcore.train.recompute",
    "mmcore.lora": "mmcore.train.lora",
    "mmcore.preference": "mmcore.train.preference",
    "mmcore.ema": "mmcore.train.ema",
    "mmcore.flops": "mmcore.train.flops",
    "mmcore.attention": "mmcore.train.attention",
    "mmcore.guards": "mmcore.train.guards",
    "mmcore.plot": "mmcore.train.plot",
    "mmcore.train_progress": "mmcore.train.progress",
    "mmcore.causal_lm": "mmcore.train.causal_lm",
    # backends
    "mmcore.backend": "mmcore.backends.protocol",
    "mmcore.fsdp2": "mmcore.backends.fsdp2",
    "mmcore.parallel_map": "mmcore.backends.megatron.tensor_map",
    "mmcore.mindspeed_mm": "mmcore.backends.megatron.mindspeed_mm",
}
#: old package -> new package: every module under it moved along
MOVED_PACKAGES: dict[str, str] = {"mmcore.megatron": "mmcore.backends.megatron"}


def new_name(old: str) -> str | None:
    """The module an old module path now names, or None when ``old`` did not move."""
    if old in MOVED:
        return MOVED[old]
    for package, moved_to in MOVED_PACKAGES.items():
        if old == package or old.startswith(package + "."):
            return moved_to + old[len(package) :]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran under its new name already."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        moved_to = new_name(fullname)
        if moved_to is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(moved_to))


def install() -> None:
    """Answer old module paths (first on ``sys.meta_path``, so that a moved package's old
    name never loads its files a second time under that name)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


__all__ = ["MOVED", "MOVED_PACKAGES", "new_name", "install"]
