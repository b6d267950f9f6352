"""The mmcore conformance suite on the deepseek-ocr pack: every stage run once."""

from mmcore.testing.conformance import PackConformance


class TestDeepseekOcrConformance(PackConformance):
    pack_name = "deepseek-ocr"
    overrides = ("data.demo_samples=8",)
    mixed_media = ("image",)
    # 52-pixel tiles: the mixed data's 48 x 48 images stay whole while its wider ones are cut, so
    # samples with and without tiles mix (it passed with DeepseekOcrModel.always_tiles off too;
    # test_deepseek_ocr_train's tiles-on-one-process test is the one that fails without it)
    mixed_overrides = ("data.image_size=52",)
    export_class = "mm_pack_deepseek_ocr.model:DeepseekOcrForCausalLM"  # no transformers class: the pack's own loads the public layout
    # the 2-CI-minute budget: infer runs on the same kit path as the other VLM packs' (make
    # test-matrix runs it here, as it does the two-process mixed-media rule)
    matrix = ("test_infer_answers_from_the_training_checkpoint_and_the_export",)
