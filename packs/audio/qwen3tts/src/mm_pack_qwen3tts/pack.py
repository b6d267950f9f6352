"""The qwen3tts pack, declared: download and convert on mmcore's engines, preprocess (text ids and
the speech tokenizer encoder's target codes), train (the talker + code predictor, mmcore's loop),
export (the public layout), evaluate and infer (text -> codes -> wav). No extract stage.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

pack = PackSpec(
    name="qwen3tts",
    category="audio",
    summary="Qwen3-TTS speech generation (Qwen3 talker + multi-codebook code predictor, 12.5 Hz codes); no demo yet, no voice cloning",
    sdk="1.25",  # mmcore.engines.cached_forward
    config_class="mm_pack_qwen3tts.settings:Qwen3TTSConfig",
    presets={"tiny": "presets/tiny.yaml"},
    default_preset="tiny",
    distributed_stages=("train",),
    stages={
        "download": "mm_pack_qwen3tts.stages:download",
        "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_qwen3tts.adapter:ADAPTER", "build_model": "mm_pack_qwen3tts.model:build_model"}),
        "preprocess": "mm_pack_qwen3tts.data:preprocess",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_qwen3tts.train:recipe"}),
        "export": "mm_pack_qwen3tts.export:export",
        "evaluate": "mm_pack_qwen3tts.generate:evaluate",
        "infer": "mm_pack_qwen3tts.generate:infer",
    },
)
