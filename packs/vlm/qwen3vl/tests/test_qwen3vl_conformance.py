"""The mmcore conformance suite on both packs of this distribution: every stage run once each."""

from mmcore.testing.conformance import PackConformance


class TestQwen3VLConformance(PackConformance):
    pack_name = "qwen3vl"
    overrides = ("data.demo_samples=8",)


class TestQwen3VLMoeConformance(PackConformance):
    pack_name = "qwen3vl-moe"
    overrides = ("data.demo_samples=8",)
