"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestWhisperConformance(PackConformance):
    pack_name = "whisper"
    overrides = ("data.demo_samples=8",)
    infer_request = {"audios": 1}  # a transcript: no prompt
