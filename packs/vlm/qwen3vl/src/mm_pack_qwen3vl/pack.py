"""The qwen3vl and qwen3vl-moe packs: one family, two entry points, the same stage code.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmcore import PackSpec, Stage, hookimpl

STAGES = {
    "download": Stage("mmcore.hub:download_stage", parts={"build_init": "mm_pack_qwen3vl.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.convert:convert_stage", parts={"adapter": "mm_pack_qwen3vl.family:ADAPTER", "build_model": "mm_pack_qwen3vl.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_qwen3vl.family:FAMILY.preprocess",
    "extract": "mm_pack_qwen3vl.extract:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_qwen3vl.family:FAMILY.recipe"}),
    "export": "mm_pack_qwen3vl.family:FAMILY.export",
    "evaluate": "mm_pack_qwen3vl.family:FAMILY.evaluate",
    "infer": "mm_pack_qwen3vl.family:FAMILY.infer",
}


@dataclass(frozen=True, eq=False)  # hashed by identity, as pluggy keeps plugins in sets
class Qwen3VLPack:
    """A pack object rather than a bare PackSpec: it also registers the family's kernels."""

    PACK: PackSpec

    @hookimpl
    def mmcore_register_kernels(self, register):
        from mm_qwen_vision.kernels import qwen_kernels

        for spec in qwen_kernels("qwen3vl"):
            register(spec)


def _spec(name: str, summary: str, presets: dict[str, str], default_preset: str) -> PackSpec:
    return PackSpec(
        name=name,
        category="vlm",
        summary=summary,
        sdk="1.7",
        config_class="mm_pack_qwen3vl.family:Qwen3VLConfig",
        presets=presets,
        default_preset=default_preset,
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


qwen3vl = Qwen3VLPack(_spec("qwen3vl", "Qwen3-VL (2B/4B/8B/32B) vision-language models", {"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"}, "demo"))
qwen3vl_moe = Qwen3VLPack(_spec("qwen3vl-moe", "Qwen3-VL MoE (30B-A3B/235B-A22B) vision-language models", {"tiny": "presets/tiny-moe.yaml"}, "tiny"))
