"""The cosyvoice3 pack, declared: what it is, its presets, and the function behind each stage.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

pack = PackSpec(
    name="cosyvoice3",
    category="audio",
    summary="CosyVoice3 speech generation (Qwen2 speech-token LM + DiT flow matching + HiFT vocoder)",
    sdk="1.28",  # mmcore.data.griffin_lim
    config_class="mm_pack_cosyvoice3.config:CosyVoice3RunConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # how the export speaks (decoding, flow steps, vocoder) is part of what evaluate measures
    stage_sections={"evaluate": ("evaluate", "generation", "speech"), "infer": ("generation", "speech")},
    stages={
        "download": "mm_pack_cosyvoice3.stages:download",
        "convert": "mm_pack_cosyvoice3.stages:convert",
        "preprocess": "mm_pack_cosyvoice3.preprocess:preprocess",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_cosyvoice3.train:recipe"}),
        "export": "mm_pack_cosyvoice3.export:export",
        "evaluate": "mm_pack_cosyvoice3.generate:evaluate",
        "infer": "mm_pack_cosyvoice3.generate:infer",
    },
)
