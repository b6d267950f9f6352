"""The whisper pack: every stage, each a thin call into this package or mmcore's engines.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, hookimpl


class WhisperPack:
    PACK = PackSpec(
        name="whisper",
        category="audio",
        summary="Whisper (tiny to large-v3) speech recognition and translation",
        config_class="mm_pack_whisper.config:WhisperConfig",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # The cache exists only with a frozen encoder, and SpecAugment makes encoder outputs vary.
        stage_sections={"extract": ("extract", "training.freeze", "training.spec_augment")},
    )

    @hookimpl
    def mmcore_download(self, ctx):
        from mm_pack_whisper.tiny import build_init_checkpoint
        from mmcore.hub import download_model

        return download_model(ctx, build_init_checkpoint)

    @hookimpl
    def mmcore_convert(self, ctx, upstream):
        from mm_pack_whisper.adapter import ADAPTER
        from mmcore.convert import convert_stage

        return convert_stage(ctx, upstream["download"].output("model"), ADAPTER)

    @hookimpl
    def mmcore_preprocess(self, ctx, upstream):
        from mm_pack_whisper.preprocess import preprocess

        return preprocess(ctx, upstream)

    @hookimpl
    def mmcore_extract(self, ctx, upstream):
        from mm_pack_whisper.extract import extract

        return extract(ctx, upstream)

    @hookimpl
    def mmcore_train(self, ctx, upstream):
        from mm_pack_whisper.model import recipe
        from mmcore.train import run_training

        return run_training(ctx, upstream, recipe(ctx, upstream))

    @hookimpl
    def mmcore_export(self, ctx, upstream):
        from mm_pack_whisper.export import export

        return export(ctx, upstream)


whisper = WhisperPack()
