"""The mmcore conformance suite on the kimi-k2.5 pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestKimiK25Conformance(PackConformance):
    pack_name = "kimi-k2.5"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
