"""The mmcore conformance suite on both packs of this distribution: every stage run once each."""

from mmcore.testing import PackConformance


class TestQwen2VLConformance(PackConformance):
    pack_name = "qwen2vl"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")
    mixed_in_make_test = True  # the VLM kit's representative


class TestQwen25VLConformance(PackConformance):
    pack_name = "qwen2.5vl"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")
    # the family's second model: its LoRA, infer and kill-resume paths are qwen2vl's (make test-matrix runs them)
    matrix = (
        "test_lora_trains_only_the_adapters_resumes_and_exports_them",
        "test_infer_answers_from_the_training_checkpoint_and_the_export",
        "test_training_killed_mid_run_resumes_to_the_same_losses",
    )
