"""The ming pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": "mm_pack_ming.family:FAMILY.download",
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_ming.family:ADAPTER", "build_model": "mm_pack_ming.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_ming.family:FAMILY.preprocess",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_ming.family:FAMILY.recipe"}),
    "export": "mm_pack_ming.family:FAMILY.export",
    "evaluate": "mm_pack_ming.family:FAMILY.evaluate",
    "infer": "mm_pack_ming.family:FAMILY.infer",
}

ming = PackSpec(
    name="ming",
    category="omni",
    summary="Ming-Lite-Omni (inclusionAI), understanding side: BailingMoe (Ling-lite) decoder with per-modality routers, Qwen2.5-VL vision tower, SAN-M audio encoder",
    sdk="1.34",
    config_class="mm_pack_ming.family:MingRunConfig",
    presets={"tiny": "presets/tiny.yaml", "demo": "presets/demo.yaml"},
    default_preset="tiny",
    distributed_stages=("train",),
    stages=STAGES,
)
