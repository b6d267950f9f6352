"""The mmcore conformance suite on the lumina-mgpt pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestLuminaConformance(PackConformance):
    pack_name = "lumina-mgpt"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
    export_class = "transformers:ChameleonForConditionalGeneration"
    # infer runs the kit's text path as the other VLM packs' (make test-matrix runs it here); the
    # pack's own picture path is evaluate's, in test_lumina_generation
    matrix = ("test_infer_answers_from_the_training_checkpoint_and_the_export",)
