"""The mmcore conformance suite on the janus pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestJanusConformance(PackConformance):
    pack_name = "janus"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
