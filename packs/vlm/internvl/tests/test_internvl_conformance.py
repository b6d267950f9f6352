"""The mmcore conformance suite on the internvl pack: every stage run once."""

from mmcore.testing import PackConformance


class TestInternVLConformance(PackConformance):
    pack_name = "internvl"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video")
    # the VLM kit's LoRA, which qwen2vl and qwen3vl run in make test (make test-matrix runs it here)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
