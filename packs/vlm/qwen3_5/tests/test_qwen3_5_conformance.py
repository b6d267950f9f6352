"""The mmcore conformance suite on the qwen3_5 pack: every stage run once each."""

from mmcore.testing.conformance import PackConformance


class TestQwen3_5Conformance(PackConformance):
    pack_name = "qwen3_5"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")
