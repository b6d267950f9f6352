"""Fixtures of the stepvideo pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def stepvideo(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
