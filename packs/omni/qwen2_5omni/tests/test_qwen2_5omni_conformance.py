"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestQwen25OmniConformance(PackConformance):
    pack_name = "qwen2.5omni"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image", "video", "audio")
    mixed_in_make_test = True  # the audio tower's representative
    infer_request = {"prompt": "<image><audio>What colour, and which tone?", "images": 1, "audios": 1}
    # the VLM kit's LoRA on the language model, which qwen2vl and qwen3vl run in make test (make test-matrix runs it here)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
