"""The qwen2.5omni pack, declared: what it is, its presets, and the function behind each stage.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

qwen25omni = PackSpec(
    name="qwen2.5omni",
    category="omni",
    summary="Qwen2.5-Omni (3B/7B) thinker: audio, image, video and text in one conversation",
    sdk="1.18",  # imports the SDK 1.18 façade
    config_class="mm_pack_qwen2_5omni.config:OmniConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # What extract caches depends on which towers are frozen.
    stage_sections={"extract": ("extract", "training.freeze")},
    stages={
        "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_qwen2_5omni.tiny:build_init_checkpoint"}),
        "convert": Stage(
            "mmcore.engines:convert_stage", parts={"adapter": "mm_pack_qwen2_5omni.adapter:ADAPTER", "build_model": "mm_pack_qwen2_5omni.family:FAMILY.build_model"}, options={"what": "thinker"}
        ),
        "preprocess": "mm_pack_qwen2_5omni.family:FAMILY.preprocess",
        "extract": "mm_pack_qwen2_5omni.extract:extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_qwen2_5omni.family:FAMILY.recipe"}),
        "export": "mm_pack_qwen2_5omni.family:FAMILY.export",
        "evaluate": "mm_pack_qwen2_5omni.family:FAMILY.evaluate",
        "infer": "mm_pack_qwen2_5omni.family:FAMILY.infer",
    },
)
