"""The mmcore conformance suite on the janus pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestJanusConformance(PackConformance):
    pack_name = "janus"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
    # LoRA and infer run on the same kit path as the other VLM packs' (make test-matrix runs them
    # here); this pack's own infer path, pictures, is tested in test_janus_generation
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them", "test_infer_answers_from_the_training_checkpoint_and_the_export")
