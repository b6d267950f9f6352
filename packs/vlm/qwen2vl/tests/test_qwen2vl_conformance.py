from mmcore.testing.conformance import PackConformance


class TestQwen2VLConformance(PackConformance):
    pack_name = "qwen2vl"


class TestQwen25VLConformance(PackConformance):
    pack_name = "qwen2.5vl"
