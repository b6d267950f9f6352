"""Fixtures of the hunyuanvideo pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def hunyuanvideo(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
