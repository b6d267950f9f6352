"""The mmcore conformance suite on the deepseek-ocr2 pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestDeepseekOcr2Conformance(PackConformance):
    pack_name = "deepseek-ocr2"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
    # infer runs on the same kit path as the other VLM packs' (make test-matrix runs it here); LoRA
    # stays in make test: this pack writes its adapter keys under the hub's names
    matrix = ("test_infer_answers_from_the_training_checkpoint_and_the_export",)
