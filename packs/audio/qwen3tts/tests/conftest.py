"""Fixtures of the qwen3tts pack's tests: a tiny random Qwen3-TTS in the public layout, offline."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_qwen3tts.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("qwen3tts") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path):  # type: ignore[no-untyped-def]
    from mm_pack_qwen3tts.model import load_pretrained

    return load_pretrained(tiny_dir)
