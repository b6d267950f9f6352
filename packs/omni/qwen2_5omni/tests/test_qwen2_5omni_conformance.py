"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing.conformance import PackConformance


class TestQwen25OmniConformance(PackConformance):
    pack_name = "qwen2.5omni"
    overrides = ("data.demo_samples=8",)
    infer_request = {"prompt": "<image><audio>What colour, and which tone?", "images": 1, "audios": 1}
