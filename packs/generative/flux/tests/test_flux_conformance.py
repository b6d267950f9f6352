"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestFluxConformance(PackConformance):
    pack_name = "flux"
    # held-out clips: the LoRA check reads their loss at fixed noise (the training loss of 6 steps is mostly noise levels)
    overrides = ("data.demo_samples=8", "data.eval_fraction=0.25")
    infer_request = {"prompt": "a red circle"}
    # the diffusion kit's LoRA, which wan runs in make test (make test-matrix runs it here)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
