"""The deepseek-ocr pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_deepseek_ocr.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_deepseek_ocr.names:ADAPTER", "build_model": "mm_pack_deepseek_ocr.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_deepseek_ocr.family:FAMILY.preprocess",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_deepseek_ocr.family:FAMILY.recipe"}),
    "export": "mm_pack_deepseek_ocr.family:FAMILY.export",
    "evaluate": "mm_pack_deepseek_ocr.family:FAMILY.evaluate",
    "infer": "mm_pack_deepseek_ocr.family:FAMILY.infer",
}


class DeepseekOcrPack:
    """No kernels of its own; packed rows use the core's ``varlen_attention`` for the decoder."""

    PACK = PackSpec(
        name="deepseek-ocr",
        category="vlm",
        summary="DeepSeek-OCR v1 (SAM + CLIP DeepEncoder + DeepSeek-MoE decoder) document OCR models, composed of transformers modules",
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_deepseek_ocr.family:DeepseekOcrRunConfig",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        stages=STAGES,
    )


deepseek_ocr = DeepseekOcrPack()
