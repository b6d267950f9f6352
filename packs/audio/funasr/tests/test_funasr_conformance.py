"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestFunAsrConformance(PackConformance):
    pack_name = "funasr"
    overrides = ("data.demo_samples=8",)
    infer_request = {"prompt": "<audio>", "audios": 1}
    mixed_media = ("audio",)  # text-only samples beside audio on two processes (make test-matrix)
    mixed_overrides = ("run.seed=1",)  # seed 0 shuffles the 7 samples so that no step splits text from audio
