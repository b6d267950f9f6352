"""The bagel pack. Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it."""

from __future__ import annotations

from mmcore import PackSpec, Stage

STAGES = {
    "download": "mm_pack_bagel.stages:download",
    "convert": "mm_pack_bagel.stages:convert",
    "preprocess": "mm_pack_bagel.data:preprocess",
    "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_bagel.recipe:recipe"}),
    "export": "mm_pack_bagel.stages:export",
    "evaluate": "mm_pack_bagel.generation:evaluate",
    "infer": "mm_pack_bagel.generation:infer",
}


class BagelPack:
    """The model is the pack's own single-device code (no transformers class for BAGEL)."""

    PACK = PackSpec(
        name="bagel",
        category="vlm",
        summary="BAGEL (Qwen2.5 Mixture-of-Transformers + SigLIP NaViT; image generation by flow matching on FLUX-VAE latents)",
        sdk="1.34",
        config_class="mm_pack_bagel.stages:BagelRunConfig",
        presets={"tiny": "presets/tiny.yaml", "demo": "presets/demo.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        stages=STAGES,
    )


bagel = BagelPack()
