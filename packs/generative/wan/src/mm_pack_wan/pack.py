"""The wan pack: Wan2.1/2.2 text-to-video through all six stages, on diffusers.

Importing this module must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from pathlib import Path

from mmcore import PackSpec, StageError, hookimpl


class WanPack:
    PACK = PackSpec(
        name="wan",
        category="generative",
        summary="Wan2.1 / Wan2.2 text-to-video (diffusers), cached VAE and UMT5 features",
        config_class="mm_pack_wan.config:WanConfig",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # extract reads the frame sampling and text length (data) as well as its own options.
        stage_sections={"extract": ("extract", "data.max_sequence_length")},
    )

    @hookimpl
    def mmcore_download(self, ctx):
        from mm_pack_wan.tiny import build_init_checkpoint
        from mmcore.hub import download_model

        result = download_model(ctx, build_init_checkpoint)
        model = result.outputs["model"]
        folder = Path(model) if Path(model).is_absolute() else ctx.stage_dir / model
        missing = [part for part in ("transformer", "vae", "text_encoder", "tokenizer", "scheduler") if not (folder / part).is_dir()]
        if missing and ctx.world.is_local_main:
            raise StageError(f"{folder}: not a diffusers Wan folder, missing {', '.join(missing)}/")
        return result

    @hookimpl
    def mmcore_convert(self, ctx, upstream):
        # Only the transformer trains; the VAE and text encoder stay frozen as they are.
        from mm_pack_wan.adapter import ADAPTER
        from mmcore.convert import convert_stage

        return convert_stage(ctx, upstream["download"].output("model") / "transformer", ADAPTER, what="transformer")

    @hookimpl
    def mmcore_preprocess(self, ctx, upstream):
        from mm_pack_wan.preprocess import preprocess

        return preprocess(ctx, upstream)

    @hookimpl
    def mmcore_extract(self, ctx, upstream):
        from mm_pack_wan.extract import extract

        return extract(ctx, upstream)

    @hookimpl
    def mmcore_train(self, ctx, upstream):
        from mm_pack_wan.model import recipe
        from mmcore.train import run_training

        return run_training(ctx, upstream, recipe(ctx, upstream))

    @hookimpl
    def mmcore_export(self, ctx, upstream):
        from mm_pack_wan.export import export

        return export(ctx, upstream)


wan = WanPack()
