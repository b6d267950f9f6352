"""The qwen3vl and qwen3vl-moe packs: one family, two entry points, the same stage code.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage
from mm_qwen_vision.kernels import QwenKernelsPack

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_qwen3vl.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_qwen3vl.family:ADAPTER", "build_model": "mm_pack_qwen3vl.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_qwen3vl.family:FAMILY.preprocess",
    "extract": "mm_pack_qwen3vl.extract:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_qwen3vl.family:FAMILY.recipe"}),
    "export": "mm_pack_qwen3vl.family:FAMILY.export",
    "evaluate": "mm_pack_qwen3vl.family:FAMILY.evaluate",
    "infer": "mm_pack_qwen3vl.family:FAMILY.infer",
}


def _spec(name: str, summary: str, presets: dict[str, str], default_preset: str) -> PackSpec:
    return PackSpec(
        name=name,
        category="vlm",
        summary=summary,
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_qwen3vl.family:Qwen3VLConfig",
        presets=presets,
        default_preset=default_preset,
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


qwen3vl = QwenKernelsPack(_spec("qwen3vl", "Qwen3-VL (2B/4B/8B/32B) vision-language models", {"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"}, "demo"), "qwen3vl")
qwen3vl_moe = QwenKernelsPack(_spec("qwen3vl-moe", "Qwen3-VL MoE (30B-A3B/235B-A22B) vision-language models", {"tiny": "presets/tiny-moe.yaml"}, "tiny"), "qwen3vl")
