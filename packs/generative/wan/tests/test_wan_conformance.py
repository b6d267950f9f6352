"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestWanConformance(PackConformance):
    pack_name = "wan"
    # held-out clips with differing captions: the conditioning rule reads their loss with their own and with swapped captions
    overrides = ("data.demo_samples=5", "data.eval_fraction=0.2")  # clips 0 and 4 held out: "a red square moves up", "a blue square moves down"
    infer_request = {"prompt": "a red square moves right"}
