"""The mmcore conformance suite on the qwen3_5 pack: every stage run once each."""

from mmcore.testing.conformance import PackConformance


class TestQwen3_5Conformance(PackConformance):
    pack_name = "qwen3_5"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")


class TestQwen3_5MoeConformance(PackConformance):
    pack_name = "qwen3_5-moe"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")
    mixed_overrides = ("training.moe_aux_loss_coef=0",)  # the router's balance loss is per micro-batch
    # LoRA, infer and kill-resume run on the same kit path as the dense pack's (make test-matrix runs them here)
    matrix = (
        "test_lora_trains_only_the_adapters_resumes_and_exports_them",
        "test_infer_answers_from_the_training_checkpoint_and_the_export",
        "test_training_killed_mid_run_resumes_to_the_same_losses",
    )
