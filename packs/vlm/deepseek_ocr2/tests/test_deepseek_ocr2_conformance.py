"""The mmcore conformance suite on the deepseek-ocr2 pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestDeepseekOcr2Conformance(PackConformance):
    pack_name = "deepseek-ocr2"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
