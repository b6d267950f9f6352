"""Helpers of mmcore's own tests (imported by name: a module called conftest would clash with packs').

Packs used here are real distributions, pip-installed into a temporary folder (``--target``)
and put on ``PYTHONPATH``/``sys.path``: discovery goes through entry points exactly as for a
user's ``pip install mm-pack-x``, without touching the test environment itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent
TOY = HERE / "fixtures" / "packs" / "toy"


def pip_install_target(projects: list[Path], target: Path) -> None:
    """pip-install project folders into ``target`` (no deps, no build isolation: offline)."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target)]
    subprocess.run([*cmd, *map(str, projects)], check=True, capture_output=True)


def write_pack_project(
    root: Path,
    dist: str,
    module: str,
    source: str,
    entry_points: dict[str, str] | None = None,
    group: str = "mmcore.packs",
    *,
    version: str = "1.0.0",
    dependencies: tuple[str, ...] = (),
) -> Path:
    """A minimal project (pyproject + one module) under ``root/dist``: a pack, or with no
    entry points a plain library."""
    project = root / dist
    (project / module).mkdir(parents=True)
    (project / module / "__init__.py").write_text(textwrap.dedent(source))
    lines = [
        "[build-system]",
        'requires = ["setuptools>=68"]',
        'build-backend = "setuptools.build_meta"',
        "",
        "[project]",
        f'name = "{dist}"',
        f'version = "{version}"',
        f"dependencies = {list(dependencies)!r}".replace("'", '"'),
        "",
        "[tool.setuptools]",
        f'packages = ["{module}"]',
    ]
    if entry_points:
        lines += ["", f'[project.entry-points."{group}"]', *(f'"{name}" = "{value}"' for name, value in entry_points.items())]
    (project / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return project


class CLI:
    """Runs ``python -m mmcore`` in a working directory with extra packs on the path."""

    def __init__(self, cwd: Path, sites: list[Path]) -> None:
        self.cwd = cwd
        self.sites = sites

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MMCORE_", "TOY_"))}
        env["PYTHONPATH"] = os.pathsep.join([*map(str, self.sites), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(extra)
        return env

    def __call__(self, *args: str, check: bool | None = True, **env: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "mmcore", *args], cwd=self.cwd, env=self.env(**env), capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"mmcore {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc
