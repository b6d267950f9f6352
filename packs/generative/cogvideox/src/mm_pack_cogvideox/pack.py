"""The cogvideox pack, declared: CogVideoX (1.0 and 1.5) text-to-video through all six stages, on diffusers.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

cogvideox = PackSpec(
    name="cogvideox",
    category="generative",
    summary="CogVideoX text-to-video (diffusers), cached 3D-VAE and T5 features, v-prediction with zero terminal SNR",
    sdk="1.19",  # imports the SDK 1.18 façade; takes part in 1.19's generative rules
    config_class="mm_pack_cogvideox.family:CogVideoXConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # extract reads the frame sampling and text length (data) as well as its own options.
    stage_sections={"extract": ("extract", "data.max_sequence_length")},
    # Only the transformer converts and trains; the VAE and T5 stay frozen as they are.
    stages={
        "download": Stage(
            "mmcore.engines:download_stage",
            parts={"build_init": "mm_pack_cogvideox.tiny:build_init_checkpoint"},
            options={"subfolders": ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")},
        ),
        "convert": Stage(
            "mmcore.engines:convert_stage",
            parts={"adapter": "mm_pack_cogvideox.family:ADAPTER", "build_model": "mm_pack_cogvideox.family:FAMILY.build_model"},
            options={"subfolder": "transformer", "what": "transformer"},
        ),
        "preprocess": "mm_pack_cogvideox.family:FAMILY.preprocess",
        "extract": "mm_pack_cogvideox.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_cogvideox.family:FAMILY.recipe"}),
        "export": "mm_pack_cogvideox.family:FAMILY.export",
        "evaluate": "mm_pack_cogvideox.family:FAMILY.evaluate",
        "infer": "mm_pack_cogvideox.family:FAMILY.infer",
    },
)
