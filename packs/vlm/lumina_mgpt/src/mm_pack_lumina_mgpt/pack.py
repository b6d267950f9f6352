"""The lumina-mgpt pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_lumina_mgpt.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_lumina_mgpt.family:ADAPTER", "build_model": "mm_pack_lumina_mgpt.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_lumina_mgpt.family:FAMILY.preprocess",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_lumina_mgpt.family:FAMILY.recipe"}),
    "export": "mm_pack_lumina_mgpt.family:FAMILY.export",
    "evaluate": "mm_pack_lumina_mgpt.family:FAMILY.evaluate",
    "infer": "mm_pack_lumina_mgpt.family:FAMILY.infer",
}

lumina_mgpt = PackSpec(
    name="lumina-mgpt",
    category="vlm",
    summary="Lumina-mGPT (Chameleon: one decoder over text and VQ image tokens; understanding and text-to-image)",
    sdk="1.18",
    config_class="mm_pack_lumina_mgpt.family:LuminaRunConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    stages=STAGES,
)
