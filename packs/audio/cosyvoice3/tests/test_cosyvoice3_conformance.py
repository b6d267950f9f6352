"""The mmcore conformance suite on the cosyvoice3 pack: every stage run once on the tiny preset."""

from mmcore.testing.conformance import PackConformance


class TestCosyVoice3Conformance(PackConformance):
    pack_name = "cosyvoice3"
    overrides = ("data.demo_samples=8",)
    infer_request = {"prompt": "seven one zero"}
    # no transformers class: the pack's own loader reads the public folder with strict=True
    export_class = "mm_pack_cosyvoice3.model:CosyVoice3Folder"
    # the 2-CI-minute budget: the LoRA rule (adapters only, resumed, exported as peft saves them and
    # merged) runs in make test-matrix
    matrix = ("test_lora_trains_only_the_adapters_resumes_and_exports_them",)
