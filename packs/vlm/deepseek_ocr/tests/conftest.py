"""Fixtures of the deepseek-ocr pack's tests: tiny checkpoints in the public layout, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_deepseek_ocr.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("tiny") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture
def mm(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
