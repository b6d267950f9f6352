"""Fixtures of the qwen3omni pack's tests: a tiny thinker and real media files, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing.media import write_wild_omni


@pytest.fixture(scope="session")
def tiny_thinker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_qwen3omni.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("qwen3omni") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture
def wild(tmp_path: Path) -> Path:
    """MLLM JSON as found in the wild: audio (wav/mp3/flac), images and a video mixed in one conversation."""
    return write_wild_omni(tmp_path / "wild")


@pytest.fixture
def omni(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
