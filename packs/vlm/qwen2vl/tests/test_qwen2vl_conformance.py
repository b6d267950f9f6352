"""The mmcore conformance suite on both packs of this distribution: every stage run once each."""

from mmcore.testing.conformance import PackConformance


class TestQwen2VLConformance(PackConformance):
    pack_name = "qwen2vl"
    overrides = ("data.demo_samples=8",)


class TestQwen25VLConformance(PackConformance):
    pack_name = "qwen2.5vl"
    overrides = ("data.demo_samples=8",)
