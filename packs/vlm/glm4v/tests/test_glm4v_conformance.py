"""The mmcore conformance suite on the glm4v pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestGlm4vConformance(PackConformance):
    pack_name = "glm4v"
    overrides = ("data.demo_samples=8",)
