"""Fixtures of the cogvideox pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def cogvideox(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
