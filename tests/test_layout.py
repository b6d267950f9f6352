"""The core's layout is its architecture (docs/development.md): folders by job, small modules,
every folder shipped, and the SDK 1.x module paths still answering until SDK 2.0."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
#: what may sit at the top of core/ besides folders (``__main__``: ``python -m mmcore``)
TOP_MODULES = {"__init__.py", "__main__.py", "errors.py", "sdk.py"}
#: a module longer than this does more than one job
MAX_LINES = 400


def test_the_top_of_core_holds_only_folders_and_the_entry_modules() -> None:
    loose = sorted(p.name for p in CORE.glob("*.py") if p.name not in TOP_MODULES)
    assert not loose, f"modules at the top of core/: {loose}; put each in the folder of its job"


def test_no_module_is_longer_than_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in CORE.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by job: {long}"


def test_every_folder_of_core_is_a_package_the_distribution_ships() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"mmcore." + ".".join(p.parent.relative_to(CORE).parts) if p.parent != CORE else "mmcore" for p in CORE.rglob("__init__.py")}
    assert folders <= listed, f"missing from pyproject.toml's packages (a wheel would lack them): {sorted(folders - listed)}"


def test_sdk_1x_module_paths_are_the_moved_modules_themselves() -> None:
    from mmcore.framework.moved import MOVED, MOVED_PACKAGES

    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    for old, new in MOVED_PACKAGES.items():
        assert importlib.import_module(old + ".engine") is importlib.import_module(new + ".engine")
    # names of the old modules that are packages now
    from mmcore.cli import main
    from mmcore.config import RunConfig, build_config
    from mmcore.train import TrainRecipe, run_training, train_stage

    assert main.__module__ == "mmcore.cli.commands" and build_config.__module__ == "mmcore.config.layers" and RunConfig.__module__ == "mmcore.config.sections"
    assert run_training.__module__ == train_stage.__module__ == "mmcore.train.loop" and TrainRecipe.__module__ == "mmcore.train.recipe"


def test_an_old_path_never_loads_a_module_twice() -> None:
    """A second copy of a module would hold its own registries, caches and classes
    (``isinstance`` failing across the two); an old path must give the one loaded module."""
    code = (
        "import sys, collections, mmcore.megatron.engine, mmcore.hub, mmcore.lora, mmcore.backends.megatron.engine, mmcore.engines.download\n"
        "objects = collections.defaultdict(set)\n"
        "for name, module in list(sys.modules.items()):\n"
        "    if name.startswith('mmcore') and getattr(module, '__file__', None):\n"
        "        objects[module.__file__].add(id(module))\n"
        "print(max(len(ids) for ids in objects.values()), sys.modules['mmcore.megatron.engine'] is sys.modules['mmcore.backends.megatron.engine'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "True"], out
