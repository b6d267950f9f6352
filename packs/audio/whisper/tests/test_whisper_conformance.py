from mmcore.testing.conformance import PackConformance


class TestWhisperConformance(PackConformance):
    pack_name = "whisper"
