"""The stepvideo pack, declared: Step-Video-T2V text-to-video through all stages, on the diffusion kit.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, Stage

stepvideo = PackSpec(
    name="stepvideo",
    category="generative",
    summary="Step-Video-T2V text-to-video (3D full-attention DiT, own code), cached VAE, Step-LLM and HunyuanCLIP features",
    sdk="1.30",  # mmcore.engines.download_stage(check_parts=), mmcore.kits.OwnFolderModel
    config_class="mm_pack_stepvideo.config:StepVideoConfig",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    distributed_stages=("train",),
    stage_sections={"extract": ("extract", "data.max_sequence_length")},
    # Only the transformer converts and trains; the VAE and text encoders stay frozen as they are.
    stages={
        "download": Stage(
            "mmcore.engines:download_stage",
            parts={"build_init": "mm_pack_stepvideo.tiny:build_init_checkpoint", "check_parts": "mm_pack_stepvideo.stepllm_io:check_pipeline_parts"},
            options={"subfolders": ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer_2", "scheduler")},
        ),
        "convert": "mm_pack_stepvideo.family:FAMILY.convert",
        "preprocess": "mm_pack_stepvideo.family:FAMILY.preprocess",
        "extract": "mm_pack_stepvideo.family:FAMILY.extract",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_stepvideo.family:FAMILY.recipe"}),
        "export": "mm_pack_stepvideo.family:FAMILY.export",
        "evaluate": "mm_pack_stepvideo.family:FAMILY.evaluate",
        "infer": "mm_pack_stepvideo.family:FAMILY.infer",
    },
)
