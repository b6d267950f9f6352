"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestHunyuanVideoConformance(PackConformance):
    pack_name = "hunyuanvideo"
    # held-out clips: the LoRA check reads their loss at fixed noise levels (the training loss of 6 steps is mostly its levels)
    overrides = ("data.demo_samples=8", "data.eval_fraction=0.25")
    infer_request = {"prompt": "a red square moves right"}
    # the diffusion kit's LoRA, which wan runs in make test (make test-matrix runs it here)
    # and its kill-and-resume, which wan's and flux's run in make test (the kit's loop, the same path)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them", "test_training_killed_mid_run_resumes_to_the_same_losses")
