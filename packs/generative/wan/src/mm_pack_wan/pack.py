"""The wan pack, declared: Wan2.1/2.2 text-to-video through all six stages, on diffusers.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

wan = PackSpec(
    name="wan",
    category="generative",
    summary="Wan2.1 / Wan2.2 text-to-video (diffusers), cached VAE and UMT5 features",
    sdk="1.19",  # imports the SDK 1.18 façade; takes part in 1.19's generative rules
    config_class="mm_pack_wan.config:WanConfig",
    presets={"demo": "presets/demo.yaml", "dpo": "presets/dpo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # extract reads the frame sampling and text length (data) as well as its own options.
    stage_sections={"extract": ("extract", "data.max_sequence_length"), "convert": ("convert", "training.expert")},
    # Only the transformer converts and trains; the VAE and text encoder stay frozen as they are.
    stages={
        "download": Stage(
            "mmcore.engines:download_stage", parts={"build_init": "mm_pack_wan.tiny:build_init_checkpoint"}, options={"subfolders": ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")}
        ),
        "convert": "mm_pack_wan.family:FAMILY.convert",  # the transformer (Wan2.2: the expert training.expert names)
        "preprocess": "mm_pack_wan.family:FAMILY.preprocess",
        "extract": "mm_pack_wan.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_wan.family:FAMILY.recipe"}),
        "export": "mm_pack_wan.family:FAMILY.export",
        "evaluate": "mm_pack_wan.family:FAMILY.evaluate",
        "infer": "mm_pack_wan.family:FAMILY.infer",
    },
)


wan_i2v = PackSpec(
    name="wan-i2v",
    category="generative",
    summary="Wan2.1 / Wan2.2 image-to-video (diffusers; TI2V-5B too): first-frame latents and mask, CLIP image features, cached",
    sdk="1.20",  # imports the SDK 1.18 façade; takes part in 1.20's conditions rule (its first frame)
    config_class="mm_pack_wan.config:WanConfig",
    presets={"demo": "presets/i2v-demo.yaml", "tiny": "presets/i2v-tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    stage_sections={"extract": ("extract", "data.max_sequence_length"), "convert": ("convert", "training.expert")},
    # Only the transformer converts and trains; the VAE, UMT5 and CLIP stay frozen as they are.
    stages={
        # image_encoder/ and image_processor/: Wan2.1's I2V models only (ImageEncoders checks)
        "download": Stage(
            "mmcore.engines:download_stage", parts={"build_init": "mm_pack_wan.tiny:build_i2v_checkpoint"}, options={"subfolders": ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")}
        ),
        "convert": "mm_pack_wan.i2v:FAMILY.convert",
        "preprocess": "mm_pack_wan.i2v:FAMILY.preprocess",
        "extract": "mm_pack_wan.i2v:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_wan.i2v:FAMILY.recipe"}),
        "export": "mm_pack_wan.i2v:FAMILY.export",
        "evaluate": "mm_pack_wan.i2v:FAMILY.evaluate",
        "infer": "mm_pack_wan.i2v:FAMILY.infer",
    },
)
