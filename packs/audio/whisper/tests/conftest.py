"""Fixtures of the whisper pack's tests: a tiny checkpoint and real audio files, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_whisper.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("whisper") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture
def whisper_cli(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
