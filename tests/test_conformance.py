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
    # No supports_lora = False: the toy declares SDK 1.0 (its own train loop, written before
    # LoRA came with 1.6), so the LoRA rule skips on its own, as for any pack written then.


def test_a_pack_written_for_sdk_1_0_is_not_failed_by_a_later_rule(toy_pack) -> None:  # type: ignore[no-untyped-def]
    """SDK minors only add: a rule for a feature that came later skips for an older pack, saying
    why, instead of failing a pack that passed conformance before (its code unchanged)."""
    from mmcore.framework.plugins import Plugins

    entry = Plugins.load().pack("toy")
    assert entry.spec.sdk == "1.0"
    suite = TestToyConformance()
    with pytest.raises(pytest.skip.Exception, match=r"^\[lora\] came with SDK 1.6; the pack declares SDK 1.0: declare PackSpec\(sdk='1.6'\) or later to take part$"):
        suite.test_lora_trains_only_the_adapters_resumes_and_exports_them(Plugins.load(), entry, Path("unused"), Path("unused"))
