"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestWanConformance(PackConformance):
    pack_name = "wan"
    overrides = ("data.demo_samples=4",)
    infer_request = {"prompt": "a red square moves right"}
