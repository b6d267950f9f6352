"""The mmcore conformance suite on this pack: every stage run once, checked against the contract."""

from mmcore.testing import PackConformance


class TestMingConformance(PackConformance):
    pack_name = "ming"
    overrides = ("data.demo_samples=8",)
    export_class = "mm_pack_ming.model:MingOmni"
    mixed_media = ("image", "audio")
    # mixed media across two ranks (the SAN-M encoder and the per-modality routers) passes, 31 s: make test-matrix
    infer_request = {"prompt": "<image><audio>What colour, and which tone?", "images": 1, "audios": 1}
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
