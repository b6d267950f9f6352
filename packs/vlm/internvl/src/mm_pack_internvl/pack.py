"""The internvl pack. Importing this module must stay light (no torch, no transformers)."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_internvl.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_internvl.family:ADAPTER", "build_model": "mm_pack_internvl.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_internvl.family:FAMILY.preprocess",
    "extract": "mm_pack_internvl.extract:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_internvl.family:FAMILY.recipe"}),
    "export": "mm_pack_internvl.family:FAMILY.export",
    "evaluate": "mm_pack_internvl.family:FAMILY.evaluate",
    "infer": "mm_pack_internvl.family:FAMILY.infer",
}


class InternVLPack:
    PACK = PackSpec(
        name="internvl",
        category="vlm",
        summary="InternVL 3 / 3.5 (1B-78B, transformers format) vision-language models",
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_internvl.family:InternVLRunConfig",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


internvl = InternVLPack()
