"""The mmcore conformance suite on the lumina-mgpt pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestLuminaConformance(PackConformance):
    pack_name = "lumina-mgpt"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
    export_class = "transformers:ChameleonForConditionalGeneration"
