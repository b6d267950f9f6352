"""What goes into a pack's environment besides the pack: this very mmcore, the host's local
libraries the pack needs (installed from a folder, so no index has them), and where wheels are.

Kept apart from :mod:`mmcore.run.envs` (the registry of environments, creating and running them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from mmcore import __version__
from mmcore.errors import MmcoreError


def pip_find_links() -> list[str]:
    """Folders pip is configured to find wheels in (uv does not read pip's config)."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    links: list[str] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            links.extend(v for v in value.strip().strip("'\"").split() if v)
    return links


def mmcore_requirement(scratch: Path) -> list[str]:
    """Installer arguments that put this very mmcore into an env, however the host installed it.

    An editable install is installed editable from its source folder. Anything else (a wheel
    from an index, a local wheel or sdist since deleted, tox's own build of the project) is
    packed back into a wheel from the installed files, in ``scratch``: the env gets the host's
    exact code without needing an index that has this version.
    """
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("mmcore")
    except PackageNotFoundError:
        return [f"mmcore=={__version__}"]
    return host_copy(dist, scratch)


def host_copy(dist: Any, scratch: Path) -> list[str]:
    """Installer arguments for the host's own install of ``dist``: editable from its folder if
    it was installed editable, else a wheel packed from its installed files."""
    direct = dist.read_text("direct_url.json")
    if direct:
        info = json.loads(direct)
        url = info.get("url", "")
        if url.startswith("file://") and info.get("dir_info", {}).get("editable"):
            return ["-e", url[len("file://") :]]
    return [str(wheel_from_installed(dist, scratch))]


def local_dependencies(project: Path, scratch: Path) -> list[str]:
    """What the pack project in folder ``project`` requires that no index has (``mm-qwen-vision``
    beside the Qwen packs): the host's copy where the host installed it from a folder, else the
    project of that name in the pack's source tree (tox's core env has the packs' sources but
    not the packs)."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import InvalidRequirement, Requirement

    pyproject = project / "pyproject.toml"
    if not pyproject.is_file():
        return []
    args: list[str] = []
    for line in tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", []):
        try:
            name = Requirement(line).name
        except InvalidRequirement:
            continue
        if name == "mmcore":
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            dist = None
        direct = json.loads((dist.read_text("direct_url.json") if dist else None) or "{}")
        if dist is not None and direct.get("url", "").startswith("file://") and "dir_info" in direct:
            args += host_copy(dist, scratch)
        elif dist is None and (sibling := _sibling_project(project, name)) is not None:
            args.append(str(sibling))  # not on this host at all: the source tree beside the pack has it
    return args


def _sibling_project(project: Path, name: str) -> Path | None:
    """A project folder named ``name`` in the source tree the pack ``project`` lives in
    (``packs/<category>/<folder>``, two levels up and down)."""
    import tomllib

    from packaging.utils import canonicalize_name

    root = project.parent.parent
    for pyproject in sorted([*root.glob("*/pyproject.toml"), *root.glob("*/*/pyproject.toml")]):
        try:
            found = tomllib.loads(pyproject.read_text()).get("project", {}).get("name", "")
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if found and canonicalize_name(found) == canonicalize_name(name):
            return pyproject.parent
    return None


#: dist-info files an installer writes about the install itself; not part of a wheel.
_INSTALL_RECORDS = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def wheel_from_installed(dist: Any, folder: Path) -> Path:
    """A pure-Python wheel of installed distribution ``dist``: its files (bytecode and scripts
    left out: installers regenerate them) and its dist-info with a fresh RECORD."""
    import base64
    import hashlib
    import zipfile

    name = dist.metadata["Name"].replace("-", "_")
    wheel = folder / f"{name}-{dist.version}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    record: list[str] = []
    info_dir = ""
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for member in sorted(dist.files or [], key=str):
            path = str(member)
            parts = member.parts
            if parts[0] == ".." or "__pycache__" in parts or path.endswith(".pyc"):
                continue
            if parts[0].endswith(".dist-info"):
                info_dir = parts[0]
                if member.name in _INSTALL_RECORDS:
                    continue
            data = Path(dist.locate_file(member)).read_bytes()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        if not info_dir:
            raise MmcoreError(f"cannot pack the installed {name} into a wheel: its file list (RECORD) is missing")
        record.append(f"{info_dir}/RECORD,,")
        archive.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return wheel


def default_requirement(pack: str) -> str:
    return f"mm-pack-{pack}"


def looks_like_path(requirement: str) -> bool:
    return requirement.startswith((".", "/", "~")) or os.sep in requirement and Path(requirement).expanduser().exists()


def uv_binary() -> str | None:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")
