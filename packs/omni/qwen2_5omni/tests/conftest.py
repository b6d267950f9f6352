"""Fixtures of the qwen2.5omni pack's tests: a tiny thinker and real media files, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing.media import write_wild_omni


@pytest.fixture(scope="session")
def tiny_omni(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_qwen2_5omni.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("omni") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture
def wild_omni(tmp_path: Path) -> Path:
    """MLLM JSON as found in the wild: audio (wav/mp3/flac), images and a video mixed in one conversation."""
    return write_wild_omni(tmp_path / "wild").parent


@pytest.fixture
def omni(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
