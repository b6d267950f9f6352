from mmcore.testing.conformance import PackConformance


class TestWanConformance(PackConformance):
    pack_name = "wan"
