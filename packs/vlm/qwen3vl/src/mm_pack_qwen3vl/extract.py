"""Extract (optional): with the vision tower frozen, run it once and train from its outputs.

Features are what the mergers (the projector, which still trains) take: the last block's
output and, concatenated after it on the feature axis, the output of each DeepStack block
(``deepstack_visual_indexes``). They are stored in safetensors shards keyed by the content hash
of the pixels and grid (identical images are encoded once); the stage's fingerprint covers the
vision weights and the preprocessing, so a changed encoder or image setting makes a new cache.
"""

from __future__ import annotations

from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.data.feature_cache import FeatureCacheWriter
from mmcore.data.shards import ShardDataset
from mmcore.pack import StageResult
from mmcore.rundir import Manifest
from mm_qwen_vision import media_key, split_items

from mm_pack_qwen3vl.family import FAMILY

MEDIA = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def vision_features(visual: Any, pixels: Any, grid: Any) -> Any:
    """[patches, hidden x (1 + DeepStack blocks)]: the last block's output, then each DeepStack block's."""
    import torch

    taken: list[Any] = []
    hooks = [visual.blocks[i].register_forward_hook(lambda module, args, out: taken.append(out)) for i in visual.deepstack_visual_indexes]
    try:
        last = visual(pixels.to(visual.dtype), grid_thw=grid).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([last, *taken], dim=-1)


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    if "vision" not in ctx.config.training.freeze:
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
                refs.setdefault(pixel_name, []).append(cache.add(media_key(pixels, grid), lambda p=pixels, g=grid: vision_features(visual, p, g)))
        cache.add_sample(refs)
    unique = cache.close()
    return StageResult(
        outputs={"features": "features"},
        metrics={"unique_media": unique, "samples": len(data)},
        notes=[f"cached vision features (last block + {len(visual.deepstack_visual_indexes)} DeepStack) of {unique} unique images/videos for {len(data)} samples"],
    )
