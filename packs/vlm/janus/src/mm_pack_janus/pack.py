"""The janus pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_janus.tiny:build_init_checkpoint"}),
    "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_janus.family:ADAPTER", "build_model": "mm_pack_janus.family:FAMILY.build_model"}),
    "preprocess": "mm_pack_janus.family:FAMILY.preprocess",
    "extract": "mm_pack_janus.extract:extract",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_janus.family:FAMILY.recipe"}),
    "export": "mm_pack_janus.family:FAMILY.export",
    "evaluate": "mm_pack_janus.family:FAMILY.evaluate",
    "infer": "mm_pack_janus.family:FAMILY.infer",
}


class JanusPack:
    """No kernels of its own; packed rows use the core's ``varlen_attention`` for the decoder."""

    PACK = PackSpec(
        name="janus",
        category="vlm",
        summary="Janus-Pro (SigLIP understanding tower + Llama decoder; image generation through VQ tokens)",
        sdk="1.18",  # imports the SDK 1.18 façade
        config_class="mm_pack_janus.family:JanusRunConfig",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # Whether extract caches anything depends on whether the vision tower is frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
        stages=STAGES,
    )


janus = JanusPack()
