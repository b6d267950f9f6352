"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing.conformance import PackConformance


class TestFluxConformance(PackConformance):
    pack_name = "flux"
    overrides = ("data.demo_samples=4",)
    infer_request = {"prompt": "a red circle"}
    # the diffusion kit's LoRA, which wan runs in make test (make test-matrix runs it here)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
