"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestOpenSoraPlanConformance(PackConformance):
    pack_name = "opensoraplan"
    # held-out clips with differing captions: the conditioning rule reads their loss with their own and with swapped captions
    overrides = ("data.demo_samples=5", "data.eval_fraction=0.2")
    infer_request = {"prompt": "a red square moves right"}
    export_class = "mm_pack_opensoraplan.pipeline:OpenSoraPlanPipeline"  # the pack's own pipeline class (diffusers has none)
