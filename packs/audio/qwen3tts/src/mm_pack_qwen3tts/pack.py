"""The qwen3tts pack, declared: download and convert on mmcore's engines, preprocess (text ids and
the speech tokenizer encoder's target codes), train (the talker + code predictor, mmcore's loop),
export (the public layout), evaluate and infer (text -> codes -> wav, heard by a fixed checker).
No extract stage. The ``demo`` preset (default): spoken-digit sentences, a demo codec fitted at
``init:demo``.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

pack = PackSpec(
    name="qwen3tts",
    category="audio",
    summary="Qwen3-TTS speech generation (Qwen3 talker + multi-codebook code predictor, 12.5 Hz codes); no voice cloning",
    sdk="1.28",  # mmcore.data.griffin_lim, mmcore.engines.kmeans_codebook
    config_class="mm_pack_qwen3tts.settings:Qwen3TTSConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # how the export is voiced is part of what evaluate measures
    stage_sections={"evaluate": ("evaluate", "generation", "speech"), "infer": ("generation", "speech")},
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
