"""The qwen3_5 and qwen3_5-moe packs: one family, two entry points, the same stage code. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

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

    def __init__(self, name: str, summary: str, presets: dict[str, str], default_preset: str) -> None:
        self.PACK = PackSpec(
            name=name,
            category="vlm",
            summary=summary,
            sdk="1.18",  # imports the SDK 1.18 façade
            config_class="mm_pack_qwen3_5.family:Qwen3_5Config",
            presets=presets,
            default_preset=default_preset,
            distributed_stages=("train",),
            # Whether extract caches anything depends on whether the vision tower is frozen.
            stage_sections={"extract": ("extract", "training.freeze")},
            stages=STAGES,
        )


qwen3_5 = Qwen3_5Pack("qwen3_5", "Qwen3.5 dense (hybrid Gated DeltaNet + full attention) vision-language models", {"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"}, "demo")
qwen3_5_moe = Qwen3_5Pack("qwen3_5-moe", "Qwen3.5 MoE (e.g. 35B-A3B, 397B-A17B) vision-language models", {"tiny": "presets/tiny-moe.yaml"}, "tiny")
