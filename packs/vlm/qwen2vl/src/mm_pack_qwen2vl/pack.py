"""The qwen2vl and qwen2.5vl packs: one family, two entry points, the same stage code.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from __future__ import annotations

from mmcore import PackSpec, hookimpl


class Qwen2VLPack:
    def __init__(self, name: str, presets: dict[str, str], default_preset: str, summary: str) -> None:
        self.PACK = PackSpec(
            name=name,
            category="vlm",
            summary=summary,
            config_class="mm_pack_qwen2vl.config:Qwen2VLConfig",
            presets=presets,
            default_preset=default_preset,
            distributed_stages=("train",),
            # Whether extract caches anything depends on whether the vision tower is frozen.
            stage_sections={"extract": ("extract", "training.freeze")},
        )

    # ------------------------------------------------------------------ download
    @hookimpl
    def mmcore_download(self, ctx):
        from mm_pack_qwen2vl.tiny import build_init_checkpoint
        from mmcore.hub import download_model

        return download_model(ctx, build_init_checkpoint)

    # ------------------------------------------------------------------ convert
    @hookimpl
    def mmcore_convert(self, ctx, upstream):
        from mm_pack_qwen2vl.adapter import ADAPTER
        from mmcore.convert import convert_stage

        return convert_stage(ctx, upstream["download"].output("model"), ADAPTER)

    # ------------------------------------------------------------------ preprocess
    @hookimpl
    def mmcore_preprocess(self, ctx, upstream):
        from mm_pack_qwen2vl.preprocess import preprocess

        return preprocess(ctx, upstream)

    # ------------------------------------------------------------------ extract
    @hookimpl
    def mmcore_extract(self, ctx, upstream):
        from mm_pack_qwen2vl.extract import extract

        return extract(ctx, upstream)

    # ------------------------------------------------------------------ train
    @hookimpl
    def mmcore_train(self, ctx, upstream):
        from mm_pack_qwen2vl.model import TokenIds, recipe
        from mmcore.data.shards import ShardDataset
        from mmcore.train import run_training

        ids = TokenIds.of(ShardDataset(upstream["preprocess"].output("dataset")))
        return run_training(ctx, upstream, recipe(ids, upstream, packing=ctx.config.training.packing))

    # ------------------------------------------------------------------ export
    @hookimpl
    def mmcore_export(self, ctx, upstream):
        from mm_pack_qwen2vl.export import export

        return export(ctx, upstream)

    # ------------------------------------------------------------------ kernels
    @hookimpl
    def mmcore_register_kernels(self, register):
        from mm_pack_qwen2vl.kernels import KERNELS

        for spec in KERNELS:
            register(spec)


qwen2vl = Qwen2VLPack(
    "qwen2vl",
    presets={"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"},
    default_preset="demo",
    summary="Qwen2-VL (2B/7B/72B) vision-language models",
)
qwen25vl = Qwen2VLPack(
    "qwen2.5vl",
    presets={"tiny": "presets/tiny-2.5.yaml"},
    default_preset="tiny",
    summary="Qwen2.5-VL (3B/7B/32B/72B) vision-language models",
)
