"""Fixtures of the ming pack's tests: a tiny release-layout folder and mixed samples, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_ming.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("tiny") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from mm_pack_ming.checkpoint import load_model

    return load_model(tiny_dir)


@pytest.fixture
def mm(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
