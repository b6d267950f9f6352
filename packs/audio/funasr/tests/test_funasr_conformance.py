"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestFunAsrConformance(PackConformance):
    pack_name = "funasr"
    overrides = ("data.demo_samples=8",)
    infer_request = {"prompt": "<audio>", "audios": 1}
    mixed_media = ("audio",)  # text-only samples beside audio on two processes (make test-matrix)
    mixed_overrides = ("run.seed=1",)  # seed 0 shuffles the 7 samples so that no step splits text from audio
    # the VLM kit's LoRA on the language model, which qwen2vl and qwen3vl run in make test (make test-matrix runs it here)
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
