"""The glm4v pack. Importing this module must stay light (no torch, no transformers)."""

from __future__ import annotations

from mmcore import PackSpec, Stage
from mm_qwen_vision.kernels import QwenKernelsPack

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_glm4v.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_glm4v.family:ADAPTER", "build_model": "mm_pack_glm4v.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_glm4v.family:FAMILY.preprocess",
    "extract": "mm_pack_glm4v.family:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_glm4v.family:FAMILY.recipe"}),
    "export": "mm_pack_glm4v.family:FAMILY.export",
    "evaluate": "mm_pack_glm4v.family:FAMILY.evaluate",
    "infer": "mm_pack_glm4v.family:FAMILY.infer",
}


def _spec(name: str, summary: str, presets: dict[str, str], default_preset: str) -> PackSpec:
    return PackSpec(
        name=name,
        category="vlm",
        summary=summary,
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_glm4v.family:Glm4vRunConfig",
        presets=presets,
        default_preset=default_preset,
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


glm4v = QwenKernelsPack(_spec("glm4v", "GLM-4.1V (9B) vision-language models", {"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"}, "demo"), "glm4v", rotary=False)
glm4v_moe = QwenKernelsPack(_spec("glm4v-moe", "GLM-4.5V (106B-A12B MoE) vision-language models", {"tiny": "presets/tiny-moe.yaml"}, "tiny"), "glm4v", rotary=False)
