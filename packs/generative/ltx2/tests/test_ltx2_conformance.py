"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestLTX2Conformance(PackConformance):
    pack_name = "ltx2"
    # held-out clips with differing captions: the conditioning rule reads their loss with their own and with swapped captions
    overrides = ("data.demo_samples=8", "data.eval_fraction=0.25")
    infer_request = {"prompt": "a red square moves right"}
    # the diffusion kit's two-process rule, LoRA and kill-and-resume, which wan runs in make test
    # (the kit's loop, the same path; make test-matrix runs them here)
    matrix = ("test_two_processes_train_as_one", "test_lora_trains_only_the_adapters_resumes_and_exports_them", "test_training_killed_mid_run_resumes_to_the_same_losses")
