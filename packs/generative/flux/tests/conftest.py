"""Fixtures of the flux pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def flux(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
