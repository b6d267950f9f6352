"""The conformance suite that packs subclass, run here on the toy pack (no convert stage, its
own export format), and shown to catch the breaks it exists for."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing.conformance import PackConformance

LINE = Path(__file__).parent / "fixtures" / "line.json"


@pytest.mark.usefixtures("toy_site")
class TestToyConformance(PackConformance):
    pack_name = "toy"
    overrides = (f"data.datasets=[{LINE}]",)
    export_class = "mm_pack_toy.kernels:load_export"
    supports_lora = False  # its own train loop, no engine
