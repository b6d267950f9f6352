"""Fixtures of the opensoraplan pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def osp(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
