"""The mmcore conformance suite on the bagel pack: every stage run once."""

from __future__ import annotations

from mmcore.testing.conformance import PackConformance


class TestBagelConformance(PackConformance):
    pack_name = "bagel"
    overrides = ("data.demo_samples=8",)
    export_class = "mm_pack_bagel.model:Bagel"
    infer_request = {"prompt": "<image>What colour is the shape?", "images": 1}
    # LoRA runs the core engine's own adapters on this pack's projections (passes; 27 s): make test-matrix
    matrix = ("test_mixed_media_on_two_processes_equals_one", "test_lora_trains_only_the_adapters_resumes_and_exports_them")
