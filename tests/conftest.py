"""Shared fixtures of mmcore's own tests (helpers live in mmcore_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mmcore_helpers import CLI, TOY, pip_install_target


@pytest.fixture(scope="session")
def toy_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy pack, pip-installed into its own folder, importable in this process too."""
    target = tmp_path_factory.mktemp("toy-site")
    pip_install_target([TOY], target)
    sys.path.insert(0, str(target))
    return target


@pytest.fixture
def toy_pack(toy_site: Path):  # type: ignore[no-untyped-def]
    import mm_pack_toy

    return mm_pack_toy.pack


@pytest.fixture
def cli(tmp_path: Path, toy_site: Path) -> CLI:
    return CLI(tmp_path, [toy_site])


@pytest.fixture
def line_data(tmp_path: Path) -> Path:
    """A dataset for the toy pack: y = 2x + 1."""
    path = tmp_path / "line.json"
    path.write_text('[{"x": 1, "y": 3}, {"x": 2, "y": 5}, {"x": 3, "y": 7}, {"x": 4, "y": 9}]')
    return path
