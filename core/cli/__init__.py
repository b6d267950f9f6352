"""The ``mmcore`` command line: the group and the stage commands (:mod:`~mmcore.cli.commands`),
``list``/``info``/``doctor`` (:mod:`~mmcore.cli.inspect_commands`, :mod:`~mmcore.cli.doctor`),
``verify`` (:mod:`~mmcore.cli.verify`), ``new-pack`` (:mod:`~mmcore.cli.newpack`); ``config``
is :mod:`mmcore.config.reference`'s. Listing, inspecting and validating never import torch.

``mmcore.cli:main`` (the console script) and the other names of the SDK 1.x module
``mmcore.cli`` are importable from here, loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    commands = importlib.import_module("mmcore.cli.commands")

    if name.startswith("__") or not hasattr(commands, name):
        raise AttributeError(f"module 'mmcore.cli' has no attribute {name!r}")
    return getattr(commands, name)
