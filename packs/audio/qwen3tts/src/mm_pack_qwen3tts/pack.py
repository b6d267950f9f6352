"""The qwen3tts pack, declared (in progress): download and convert run on mmcore's own stage
engines (the public checkpoint is a safetensors folder with a root config.json); the other
stages do not exist yet and are skipped visibly by ``mmcore run``.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

pack = PackSpec(
    name="qwen3tts",
    category="audio",
    summary="Qwen3-TTS speech generation (Qwen3 talker + multi-codebook code predictor); in progress: download + convert only",
    sdk="1.25",  # mmcore.engines.cached_forward
    presets={"tiny": "presets/tiny.yaml"},
    default_preset="tiny",
    distributed_stages=(),
    stages={
        "download": "mm_pack_qwen3tts.stages:download",
        "convert": Stage("mmcore.engines:convert_stage", parts={"adapter": "mm_pack_qwen3tts.adapter:ADAPTER", "build_model": "mm_pack_qwen3tts.model:build_model"}),
    },
)
