"""The hunyuanvideo pack, declared: HunyuanVideo text-to-video through all six stages, on diffusers.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

hunyuanvideo = PackSpec(
    name="hunyuanvideo",
    category="generative",
    summary="HunyuanVideo text-to-video (diffusers), cached 3D-VAE, Llama and CLIP features, flow matching with the guidance embedding",
    sdk="1.19",  # imports the SDK 1.18 façade; takes part in 1.19's generative rules
    config_class="mm_pack_hunyuanvideo.family:HunyuanVideoConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    # extract reads the frame sampling and text length (data) as well as its own options.
    stage_sections={"extract": ("extract", "data.max_sequence_length")},
    # Only the transformer converts and trains; the VAE and text encoders stay frozen as they are.
    stages={
        "download": Stage(
            "mmcore.engines:download_stage",
            parts={"build_init": "mm_pack_hunyuanvideo.tiny:build_init_checkpoint"},
            options={"subfolders": ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler")},
        ),
        "convert": Stage(
            "mmcore.engines:convert_stage",
            parts={"adapter": "mm_pack_hunyuanvideo.family:ADAPTER", "build_model": "mm_pack_hunyuanvideo.family:FAMILY.build_model"},
            options={"subfolder": "transformer", "what": "transformer"},
        ),
        "preprocess": "mm_pack_hunyuanvideo.family:FAMILY.preprocess",
        "extract": "mm_pack_hunyuanvideo.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_hunyuanvideo.family:FAMILY.recipe"}),
        "export": "mm_pack_hunyuanvideo.family:FAMILY.export",
        "evaluate": "mm_pack_hunyuanvideo.family:FAMILY.evaluate",
        "infer": "mm_pack_hunyuanvideo.family:FAMILY.infer",
    },
)

hunyuanvideo15 = PackSpec(
    name="hunyuanvideo1.5",
    category="generative",
    summary="HunyuanVideo 1.5 text-to-video (diffusers), cached VAE, Qwen2.5-VL and ByT5 features, flow matching",
    sdk="1.19",  # imports the SDK 1.18 façade; takes part in 1.19's generative rules
    config_class="mm_pack_hunyuanvideo.v15:V15Config",
    presets={"demo": "presets/v15-demo.yaml", "tiny": "presets/v15-tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    stage_sections={"extract": ("extract", "data.max_sequence_length")},
    stages={
        "download": Stage(
            "mmcore.engines:download_stage",
            parts={"build_init": "mm_pack_hunyuanvideo.tiny:build_v15_checkpoint"},
            options={"subfolders": ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "guider", "scheduler")},
        ),
        "convert": Stage(
            "mmcore.engines:convert_stage",
            parts={"adapter": "mm_pack_hunyuanvideo.family:ADAPTER", "build_model": "mm_pack_hunyuanvideo.v15:FAMILY.build_model"},
            options={"subfolder": "transformer", "what": "transformer"},
        ),
        "preprocess": "mm_pack_hunyuanvideo.v15:FAMILY.preprocess",
        "extract": "mm_pack_hunyuanvideo.v15:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_hunyuanvideo.v15:FAMILY.recipe"}),
        "export": "mm_pack_hunyuanvideo.v15:FAMILY.export",
        "evaluate": "mm_pack_hunyuanvideo.v15:FAMILY.evaluate",
        "infer": "mm_pack_hunyuanvideo.v15:FAMILY.infer",
    },
)
