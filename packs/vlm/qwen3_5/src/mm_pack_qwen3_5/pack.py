"""The qwen3_5 pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_qwen3_5.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_qwen3_5.family:ADAPTER", "build_model": "mm_pack_qwen3_5.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_qwen3_5.family:FAMILY.preprocess",
    "extract": "mm_pack_qwen3_5.family:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_qwen3_5.family:FAMILY.recipe"}),
    "export": "mm_pack_qwen3_5.family:FAMILY.export",
    "evaluate": "mm_pack_qwen3_5.family:FAMILY.evaluate",
    "infer": "mm_pack_qwen3_5.family:FAMILY.infer",
}


class Qwen3_5Pack:
    """No kernels of its own: Qwen3.5's RMSNorm is zero-centred (``1 + weight``), not the Qwen
    text kernel's; packed rows use the core's ``varlen_attention`` for the full-attention layers."""

    PACK = PackSpec(
        name="qwen3_5",
        category="vlm",
        summary="Qwen3.5 (dense; hybrid Gated DeltaNet + full attention) vision-language models",
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_qwen3_5.family:Qwen3_5Config",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


qwen3_5 = Qwen3_5Pack()
