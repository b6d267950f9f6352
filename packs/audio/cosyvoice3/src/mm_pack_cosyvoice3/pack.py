"""The cosyvoice3 pack, declared (in progress): download and convert run; the other stages do not
exist yet and are skipped visibly by ``mmcore run``.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec

pack = PackSpec(
    name="cosyvoice3",
    category="audio",
    summary="CosyVoice3 speech generation (Qwen2 speech-token LM + DiT flow matching + HiFT); in progress: download + convert only",
    sdk="1.25",  # mmcore.engines.cached_forward
    presets={"tiny": "presets/tiny.yaml"},
    default_preset="tiny",
    distributed_stages=(),
    stages={
        "download": "mm_pack_cosyvoice3.stages:download",
        "convert": "mm_pack_cosyvoice3.stages:convert",
    },
)
