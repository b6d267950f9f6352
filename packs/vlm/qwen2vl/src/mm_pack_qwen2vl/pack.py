"""The qwen2vl and qwen2.5vl packs: one family, two entry points, the same stage code.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage
from mm_qwen_vision.kernels import QwenKernelsPack

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_qwen2vl.tiny:build_init_checkpoint"}),
    "convert": Stage(
        "mmcore.engines:convert_stage",
        parts={"adapter": "mm_pack_qwen2vl.adapter:ADAPTER", "build_model": "mm_pack_qwen2vl.family:FAMILY.build_model", "parallel_map": "mm_pack_qwen2vl.megatron:of_checkpoint"},
    ),
    "preprocess": "mm_pack_qwen2vl.family:FAMILY.preprocess",
    "extract": "mm_pack_qwen2vl.extract:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_qwen2vl.family:FAMILY.recipe"}),
    "export": "mm_pack_qwen2vl.family:FAMILY.export",
    "evaluate": "mm_pack_qwen2vl.family:FAMILY.evaluate",
    "infer": "mm_pack_qwen2vl.family:FAMILY.infer",
}


def _spec(name: str, summary: str, presets: dict[str, str], default_preset: str) -> PackSpec:
    return PackSpec(
        name=name,
        category="vlm",
        summary=summary,
        sdk="1.25",  # imports the SDK 1.18 façade; 1.25: context parallelism on megatron (context_multiple, to_context_rank)
        config_class="mm_pack_qwen2vl.config:Qwen2VLConfig",
        presets=presets,
        default_preset=default_preset,
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


qwen2vl = QwenKernelsPack(
    _spec(
        "qwen2vl",
        "Qwen2-VL (2B/7B/72B) vision-language models",
        {"demo": "presets/demo.yaml", "lora": "presets/lora.yaml", "dpo": "presets/dpo.yaml", "grpo": "presets/grpo.yaml", "tiny": "presets/tiny.yaml"},
        "demo",
    ),
    "qwen2vl",
)
qwen25vl = QwenKernelsPack(_spec("qwen2.5vl", "Qwen2.5-VL (3B/7B/32B/72B) vision-language models", {"tiny": "presets/tiny-2.5.yaml"}, "tiny"), "qwen2vl")
