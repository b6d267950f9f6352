"""The conformance suite that packs subclass, run here on the toy pack."""

from __future__ import annotations

import pytest

from mmcore.testing.conformance import PackConformance


@pytest.mark.usefixtures("toy_site")
class TestToyConformance(PackConformance):
    pack_name = "toy"
