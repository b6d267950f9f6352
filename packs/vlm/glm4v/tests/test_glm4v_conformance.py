"""The mmcore conformance suite on the glm4v pack: every stage run once."""

from mmcore.testing import PackConformance


class TestGlm4vConformance(PackConformance):
    pack_name = "glm4v"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")
    # the VLM kit's LoRA, which qwen2vl and qwen3vl run in make test (make test-matrix runs it here)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)


class TestGlm4vMoeConformance(PackConformance):
    """GLM-4.5V: per-expert hub tensors stacked into transformers' fused experts and split again
    (convert's bit-identical round trip), the router's loss in training."""

    pack_name = "glm4v-moe"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")
    mixed_overrides = ("training.moe_aux_loss_coef=0",)  # the router's balance loss is per micro-batch
    # LoRA adapts the attention, infer and kill-resume run, as in glm4v (make test-matrix runs them here)
    matrix = (
        "test_lora_trains_only_the_adapters_resumes_and_exports_them",
        "test_infer_answers_from_the_training_checkpoint_and_the_export",
        "test_training_killed_mid_run_resumes_to_the_same_losses",
    )
