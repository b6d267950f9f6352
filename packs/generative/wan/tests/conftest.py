"""Fixtures of the wan pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def wan(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
