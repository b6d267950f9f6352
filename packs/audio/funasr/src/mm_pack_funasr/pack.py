"""The funasr pack, declared: what it is, its presets, and the function behind each stage.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

pack = PackSpec(
    name="funasr",
    category="audio",
    summary="Fun-ASR-Nano (0.8B): speech recognition by an audio encoder and adaptor feeding Qwen3",
    sdk="1.33",  # mmcore.data.lfr (the SAN-M front end, moved into the core)
    config_class="mm_pack_funasr.config:FunAsrConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    stages={
        "download": Stage("mmcore.engines:download_stage", parts={"build_init": "mm_pack_funasr.tiny:build_init_checkpoint"}),
        "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_funasr.adapter:ADAPTER", "build_model": "mm_pack_funasr.family:FAMILY.build_model"}),
        "preprocess": "mm_pack_funasr.family:FAMILY.preprocess",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_funasr.family:FAMILY.recipe"}),
        "export": "mm_pack_funasr.family:FAMILY.export",
        "evaluate": "mm_pack_funasr.family:FAMILY.evaluate",
        "infer": "mm_pack_funasr.family:FAMILY.infer",
    },
)
