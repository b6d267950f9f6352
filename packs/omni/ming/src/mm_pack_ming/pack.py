"""The ming pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec

ming = PackSpec(
    name="ming",
    category="omni",
    summary="Ming-Lite-Omni (inclusionAI), understanding side: BailingMoe (Ling-lite) decoder with per-modality routers, Qwen2.5-VL vision tower, SAN-M audio encoder",
    sdk="1.18",
    presets={},
    stages={},
)
