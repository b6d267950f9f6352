"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestWanConformance(PackConformance):
    pack_name = "wan"
    # held-out clips with differing captions: the conditioning rule reads their loss with their own and with swapped captions
    overrides = ("data.demo_samples=6", "data.eval_fraction=0.34")
    infer_request = {"prompt": "a red square moves right"}
