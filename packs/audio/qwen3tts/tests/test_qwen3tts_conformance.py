"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestQwen3TTSConformance(PackConformance):
    pack_name = "qwen3tts"
    overrides = ("data.demo_samples=8", "generation.max_new_tokens=4")
    export_class = "mm_pack_qwen3tts.model:Qwen3TTS"  # no transformers class: the pack's from_pretrained (strict) reads the public layout
    infer_request = {"prompt": "one two three"}  # text in, a wav out
    # the 2-CI-minute budget: test_qwen3tts_stages.py runs `mmcore infer` on the export in make
    # test; the LoRA rule (about a minute here) runs in make test-matrix
    matrix = ("test_infer_answers_from_the_training_checkpoint_and_the_export", "test_lora_trains_only_the_adapters_resumes_and_exports_them")
