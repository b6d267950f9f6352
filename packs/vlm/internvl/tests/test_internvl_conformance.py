"""The mmcore conformance suite on the internvl pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestInternVLConformance(PackConformance):
    pack_name = "internvl"
    overrides = ("data.demo_samples=8",)
