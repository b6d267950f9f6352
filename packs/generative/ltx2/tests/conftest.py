"""Fixtures of the ltx2 pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def ltx2(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
