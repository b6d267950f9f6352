"""Lazy re-exports for the SDK's façade modules (``mmcore.engines``, ``mmcore.train``, ...).

A façade lists the public names of its folder and where each is defined; a name's module is
imported on first use (PEP 562), so ``from mmcore.engines import convert_stage`` costs only
what the converter needs, and importing a façade never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(facade: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module ``facade``: ``exports`` maps each public name
    to the module that defines it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {facade!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(set(exports) | set(importlib.import_module(facade).__dict__))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
