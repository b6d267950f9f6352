"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestQwen3OmniConformance(PackConformance):
    pack_name = "qwen3omni"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video", "audio")
    mixed_overrides = ("training.moe_aux_loss_coef=0",)  # the router's balance loss is per micro-batch
    infer_request = {"prompt": "<image><audio>What colour, and which tone?", "images": 1, "audios": 1}
    # the VLM kit's LoRA on the language model, which qwen2vl and qwen3vl run in make test (make test-matrix runs it here)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
