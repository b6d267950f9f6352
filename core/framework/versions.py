"""Versions recorded in manifests and checked by ``mmcore doctor``: read from metadata, never by import."""

from __future__ import annotations

import importlib.metadata as md
import platform
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from mmcore import __version__


def installed_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def requirements_of(distribution: str | None) -> list[Requirement]:
    """The unconditional requirements of an installed distribution (extras' requirements left out)."""
    if not distribution:
        return []
    try:
        raw = md.requires(distribution) or []
    except md.PackageNotFoundError:
        return []
    reqs = []
    for line in raw:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        reqs.append(req)
    return reqs


def unmet_requirements(distribution: str | None) -> list[str]:
    """Requirements of ``distribution`` that are missing or at a version outside their range."""
    problems = []
    for req in requirements_of(distribution):
        have = installed_version(req.name)
        if have is None:
            problems.append(f"{req} (not installed)")
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req} (installed: {have})")
    return problems


def version_record(distribution: str | None, pack_version: str | None) -> dict[str, Any]:
    libraries = {"torch": installed_version("torch")}
    for req in requirements_of(distribution):
        libraries[req.name] = installed_version(req.name)
    return {
        "mmcore": __version__,
        "pack": f"{distribution} {pack_version}" if distribution else None,
        "python": platform.python_version(),
        "libraries": libraries,
    }
