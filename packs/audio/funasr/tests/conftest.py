"""Fixtures of the funasr pack's tests: a tiny Fun-ASR-Nano and audio files, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_funasr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_funasr.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("funasr") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture
def funasr(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
