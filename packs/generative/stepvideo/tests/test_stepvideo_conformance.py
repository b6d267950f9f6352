"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestStepVideoConformance(PackConformance):
    pack_name = "stepvideo"
    # held-out clips with differing captions: the conditioning rule reads their loss with their own and with swapped captions
    overrides = ("data.demo_samples=5", "data.eval_fraction=0.2")
    infer_request = {"prompt": "a red square moves right"}
    export_class = "mm_pack_stepvideo.pipeline:StepVideoPipeline"  # the pack's own pipeline class (diffusers has none)
    # the diffusion kit's LoRA and kill-and-resume, which wan runs in make test (the kit's loop, the
    # same path; make test-matrix runs them here): the pack's tests stay within their 2 CI-minutes
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them", "test_training_killed_mid_run_resumes_to_the_same_losses")
