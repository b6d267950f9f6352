"""The qwen2.5omni pack: every stage, each a thin call into this package or mmcore's engines.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, hookimpl


class Qwen25OmniPack:
    PACK = PackSpec(
        name="qwen2.5omni",
        category="omni",
        summary="Qwen2.5-Omni (3B/7B) thinker: audio, image, video and text in one conversation",
        config_class="mm_pack_qwen2_5omni.config:OmniConfig",
        presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
        default_preset="demo",
        distributed_stages=("train",),
        # What extract caches depends on which towers are frozen.
        stage_sections={"extract": ("extract", "training.freeze")},
    )

    @hookimpl
    def mmcore_download(self, ctx):
        from mm_pack_qwen2_5omni.tiny import build_init_checkpoint
        from mmcore.hub import download_model

        return download_model(ctx, build_init_checkpoint)

    @hookimpl
    def mmcore_convert(self, ctx, upstream):
        from mm_pack_qwen2_5omni.adapter import ADAPTER
        from mmcore.convert import convert_stage

        return convert_stage(ctx, upstream["download"].output("model"), ADAPTER, what="thinker")

    @hookimpl
    def mmcore_preprocess(self, ctx, upstream):
        from mm_pack_qwen2_5omni.preprocess import preprocess

        return preprocess(ctx, upstream)

    @hookimpl
    def mmcore_extract(self, ctx, upstream):
        from mm_pack_qwen2_5omni.extract import extract

        return extract(ctx, upstream)

    @hookimpl
    def mmcore_train(self, ctx, upstream):
        from mm_pack_qwen2_5omni.model import TokenIds, recipe
        from mmcore.data.shards import ShardDataset
        from mmcore.train import run_training

        ids = TokenIds.of(ShardDataset(upstream["preprocess"].output("dataset")))
        return run_training(ctx, upstream, recipe(ids, upstream, packing=ctx.config.training.packing))

    @hookimpl
    def mmcore_export(self, ctx, upstream):
        from mm_pack_qwen2_5omni.export import export

        return export(ctx, upstream)


qwen25omni = Qwen25OmniPack()
