from mmcore.testing.conformance import PackConformance


class TestQwen25OmniConformance(PackConformance):
    pack_name = "qwen2.5omni"
