"""The kimi-k2.5 pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_kimi_k25.tiny:build_init_checkpoint"}),
    "convert": "mm_pack_kimi_k25.family:convert",
    "preprocess": "mm_pack_kimi_k25.family:FAMILY.preprocess",
    "extract": "mm_pack_kimi_k25.extract:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_kimi_k25.family:FAMILY.recipe"}),
    "export": "mm_pack_kimi_k25.family:FAMILY.export",
    "evaluate": "mm_pack_kimi_k25.family:FAMILY.evaluate",
    "infer": "mm_pack_kimi_k25.family:FAMILY.infer",
}


class KimiK25Pack:
    """No kernels of its own; packed rows use the core's ``varlen_attention`` for the decoder."""

    PACK = PackSpec(
        name="kimi-k2.5",
        category="vlm",
        summary="Kimi-K2.5 (MoonViT + patch merger + DeepSeek-V3 MoE decoder) vision-language models",
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_kimi_k25.family:KimiK25Config",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


kimi_k25 = KimiK25Pack()
