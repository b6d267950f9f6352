"""The mmcore conformance suite on the glm4v pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestGlm4vConformance(PackConformance):
    pack_name = "glm4v"
    overrides = ("data.demo_samples=8",)


class TestGlm4vMoeConformance(PackConformance):
    """GLM-4.5V: per-expert hub tensors stacked into transformers' fused experts and split again
    (convert's bit-identical round trip), the router's loss in training."""

    pack_name = "glm4v-moe"
    overrides = ("data.demo_samples=8",)
