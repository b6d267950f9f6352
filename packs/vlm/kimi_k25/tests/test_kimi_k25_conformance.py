"""The mmcore conformance suite on the kimi-k2.5 pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestKimiK25Conformance(PackConformance):
    pack_name = "kimi-k2.5"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
    # infer runs on the same kit path as the other VLM packs' (make test-matrix runs it here)
    matrix = ("test_infer_answers_from_the_training_checkpoint_and_the_export",)
