"""The whisper pack, declared: what it is, its presets, and the function behind each stage.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

whisper = PackSpec(
    name="whisper",
    category="audio",
    summary="Whisper (tiny to large-v3) speech recognition and translation",
    sdk="1.25",  # mmcore.engines.cached_forward
    config_class="mm_pack_whisper.config:WhisperConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # The cache exists only with a frozen encoder, and SpecAugment makes encoder outputs vary.
    stage_sections={"extract": ("extract", "training.freeze", "training.spec_augment")},
    stages={
        "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_whisper.tiny:build_init_checkpoint"}),
        "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_whisper.adapter:ADAPTER", "build_model": "mm_pack_whisper.model:build_model"}),
        "preprocess": "mm_pack_whisper.preprocess:preprocess",
        "extract": "mm_pack_whisper.extract:extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_whisper.model:recipe"}),
        "export": "mm_pack_whisper.export:export",
        "evaluate": "mm_pack_whisper.generate:evaluate",
        "infer": "mm_pack_whisper.generate:infer",
    },
)
