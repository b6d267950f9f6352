"""The qwen3omni pack, declared: what it is, its presets, and the function behind each stage.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage
from mm_qwen_vision.kernels import QwenKernelsPack

qwen3omni = QwenKernelsPack(
    PackSpec(
        name="qwen3omni",
        category="omni",
        summary="Qwen3-Omni (30B-A3B) MoE thinker: audio, image, video and text in one conversation",
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_qwen3omni.family:Qwen3OmniConfig",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # What extract caches depends on which towers are frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages={
            "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_qwen3omni.tiny:build_init_checkpoint"}),
            "convert": Stage(
                "mmcore.engines:convert_stage", parts={"adapter": "mm_pack_qwen3omni.family:ADAPTER", "build_model": "mm_pack_qwen3omni.family:FAMILY.build_model"}, options={"what": "thinker"}
            ),
            "preprocess": "mm_pack_qwen3omni.family:FAMILY.preprocess",
            "extract": "mm_pack_qwen3omni.extract:extract",
            "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_qwen3omni.family:FAMILY.recipe"}),
            "export": "mm_pack_qwen3omni.family:FAMILY.export",
            "evaluate": "mm_pack_qwen3omni.family:FAMILY.evaluate",
            "infer": "mm_pack_qwen3omni.family:FAMILY.infer",
        },
    ),
    "qwen3omni",
)
