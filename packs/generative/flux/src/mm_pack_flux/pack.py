"""The flux pack, declared: FLUX text-to-image through all six stages, on diffusers.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

flux = PackSpec(
    name="flux",
    category="generative",
    summary="FLUX.1 text-to-image (diffusers), cached VAE, CLIP and T5 features, guidance embedding",
    sdk="1.19",  # imports the SDK 1.18 façade; takes part in 1.19's generative rules
    config_class="mm_pack_flux.family:FluxConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml", "grpo": "presets/grpo.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # extract reads the image sampling and text length (data) as well as its own options.
    stage_sections={"extract": ("extract", "data.max_sequence_length")},
    # Only the transformer converts and trains; the VAE and text encoders stay frozen as they are.
    stages={
        "download": Stage(
            "mmcore.engines:download_stage",
            parts={"build_init": "mm_pack_flux.tiny:build_init_checkpoint"},
            options={"subfolders": ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler")},
        ),
        "convert": Stage(
            "mmcore.engines:convert_stage",
            parts={"adapter": "mm_pack_flux.family:ADAPTER", "build_model": "mm_pack_flux.family:FAMILY.build_model"},
            options={"subfolder": "transformer", "what": "transformer"},
        ),
        "preprocess": "mm_pack_flux.family:FAMILY.preprocess",
        "extract": "mm_pack_flux.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_flux.family:FAMILY.recipe"}),
        "export": "mm_pack_flux.family:FAMILY.export",
        "evaluate": "mm_pack_flux.family:FAMILY.evaluate",
        "infer": "mm_pack_flux.family:FAMILY.infer",
    },
)
