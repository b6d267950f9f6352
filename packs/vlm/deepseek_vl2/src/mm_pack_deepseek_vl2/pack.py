"""The deepseek-vl2 pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_deepseek_vl2.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_deepseek_vl2.names:ADAPTER", "build_model": "mm_pack_deepseek_vl2.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_deepseek_vl2.family:FAMILY.preprocess",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_deepseek_vl2.family:FAMILY.recipe"}),
    "export": "mm_pack_deepseek_vl2.family:FAMILY.export",
    "evaluate": "mm_pack_deepseek_vl2.family:FAMILY.evaluate",
    "infer": "mm_pack_deepseek_vl2.family:FAMILY.infer",
}


class DeepseekVL2Pack:
    """No kernels of its own; packed rows use the core's ``varlen_attention`` for the decoder."""

    PACK = PackSpec(
        name="deepseek-vl2",
        category="vlm",
        summary="DeepSeek-VL2 (SigLIP-SO400M + 2x2 downsample MLP + DeepSeek-MoE decoder, dynamic tiling) vision-language models",
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_deepseek_vl2.family:DeepseekVL2Config",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        stages=STAGES,
    )


deepseek_vl2 = DeepseekVL2Pack()
