"""Extract (optional): with the vision tower frozen, run it once and train from its outputs.

Features are the vision blocks' outputs *before* the merger (the projector), so the projector
still trains. They are stored in safetensors shards keyed by the content hash of the pixels and
grid (identical images are encoded once); the stage's fingerprint already covers the vision
weights and the preprocessing, so a changed encoder or image setting makes a new cache.
"""

from __future__ import annotations

from typing import Mapping

from mmcore.context import StageContext
from mm_qwen_vision import media_key, split_items
from mmcore.data.feature_cache import FeatureCacheWriter
from mmcore.data.shards import ShardDataset
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

from mm_pack_qwen2vl.family import FAMILY

MEDIA = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def vision_frozen(ctx: StageContext) -> bool:
    return "vision" in ctx.config.training.freeze


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    if not vision_frozen(ctx):
        return None  # the vision tower trains: nothing to cache
    model = FAMILY.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    visual = model.model.visual
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample = data[i]
        refs: dict[str, list[str]] = {}
        for pixel_name, grid_name in MEDIA:
            for pixels, grid in split_items(sample.get(pixel_name, []), sample.get(grid_name, [])):
                refs.setdefault(pixel_name, []).append(cache.add(
                    media_key(pixels, grid), lambda p=pixels, g=grid: visual(p.to(visual.dtype), grid_thw=g).last_hidden_state))
        cache.add_sample(refs)
    unique = cache.close()
    return StageResult(
        outputs={"features": "features"},
        metrics={"unique_media": unique, "samples": len(data)},
        notes=[f"cached vision features of {unique} unique images/videos for {len(data)} samples"],
    )
