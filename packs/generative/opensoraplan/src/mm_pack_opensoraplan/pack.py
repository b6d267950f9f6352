"""The opensoraplan pack, declared: Open-Sora Plan v1.5 text-to-video through all stages, on the diffusion kit.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

opensoraplan = PackSpec(
    name="opensoraplan",
    category="generative",
    summary="Open-Sora Plan v1.5 text-to-video (sparse U-shaped MMDiT, own code), cached VAE, T5 and CLIP features",
    sdk="1.30",  # mmcore.engines.download_stage(check_parts=), mmcore.kits.OwnFolderModel
    config_class="mm_pack_opensoraplan.config:OpenSoraPlanConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    stage_sections={"extract": ("extract", "data.max_sequence_length")},
    # Only the transformer converts and trains; the VAE and text encoders stay frozen as they are.
    stages={
        "download": Stage(
            "mmcore.engines:download_stage",
            parts={"build_init": "mm_pack_opensoraplan.tiny:build_init_checkpoint", "check_parts": "mm_pack_opensoraplan.wfvae_io:check_pipeline_vae"},
            options={"subfolders": ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler")},
        ),
        "convert": "mm_pack_opensoraplan.family:FAMILY.convert",
        "preprocess": "mm_pack_opensoraplan.family:FAMILY.preprocess",
        "extract": "mm_pack_opensoraplan.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_opensoraplan.family:FAMILY.recipe"}),
        "export": "mm_pack_opensoraplan.family:FAMILY.export",
        "evaluate": "mm_pack_opensoraplan.family:FAMILY.evaluate",
        "infer": "mm_pack_opensoraplan.family:FAMILY.infer",
    },
)
