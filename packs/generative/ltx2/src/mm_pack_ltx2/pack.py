"""The ltx2 pack, declared: LTX-2 text-to-video-with-sound through all stages, on diffusers.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

ltx2 = PackSpec(
    name="ltx2",
    category="generative",
    summary="LTX-2 joint video + audio generation (diffusers): one transformer over video and audio latents, cached VAEs and Gemma-3 features",
    sdk="1.25",  # mmcore.engines.fit_demo_autoencoder (its audio VAE)
    config_class="mm_pack_ltx2.config:LTX2Config",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    stage_sections={"extract": ("extract", "data.max_sequence_length")},
    # Only the joint transformer converts and trains; the video and audio VAEs, Gemma-3, its
    # connectors and the vocoder stay frozen as they are.
    stages={
        "download": Stage(
            "mmcore.engines:download_stage",
            parts={"build_init": "mm_pack_ltx2.tiny:build_init_checkpoint"},
            options={"subfolders": ("transformer", "vae", "audio_vae", "text_encoder", "tokenizer", "connectors", "vocoder", "scheduler")},
        ),
        "convert": "mm_pack_ltx2.family:FAMILY.convert",
        "preprocess": "mm_pack_ltx2.family:FAMILY.preprocess",
        "extract": "mm_pack_ltx2.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_ltx2.family:FAMILY.recipe"}),
        "export": "mm_pack_ltx2.family:FAMILY.export",
        "evaluate": "mm_pack_ltx2.family:FAMILY.evaluate",
        "infer": "mm_pack_ltx2.family:FAMILY.infer",
    },
)
