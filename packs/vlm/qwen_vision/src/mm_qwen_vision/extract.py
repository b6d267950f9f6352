"""The extract stage of a Qwen-style vision tower (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V):
with the tower frozen, run it once per unique image or video and train from its outputs.

What is cached is what the projector (which still trains) reads: by default the tower's
``last_hidden_state``; a family passes ``features`` where it reads more (Qwen3-VL's DeepStack
blocks). Features are stored in safetensors shards keyed by the content hash of the pixels and
grid (identical media are encoded once); the stage's fingerprint covers the vision weights and
the preprocessing, so a changed encoder or image setting makes a new cache.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mmcore.context import StageContext
from mmcore.data.feature_cache import FeatureCacheWriter
from mmcore.data.shards import ShardDataset
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

from mm_qwen_vision import media_key, split_items

MEDIA = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def tower_output(visual: Any, pixels: Any, grid: Any) -> Any:
    return visual(pixels.to(visual.dtype), grid_thw=grid).last_hidden_state


def extract_vision(ctx: StageContext, upstream: Mapping[str, Manifest], family: Any,
                   features: Callable[[Any, Any, Any], Any] = tower_output, what: str = "vision features") -> StageResult | None:
    """The stage: None (declined) unless ``training.freeze`` holds ``vision``.

    Args:
        family: the pack's :class:`~mmcore.kits.vlm.VLMFamily` (builds the converted model).
        features: ``(tower, pixels, grid[1, 3]) -> tensor`` of one image or video.
        what: how the notes name what was cached.
    """
    if "vision" not in ctx.config.training.freeze:
        return None  # the vision tower trains: nothing to cache
    model = family.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    visual = model.model.visual
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample = data[i]
        refs: dict[str, list[str]] = {}
        for pixel_name, grid_name in MEDIA:
            for pixels, grid in split_items(sample.get(pixel_name, []), sample.get(grid_name, [])):
                refs.setdefault(pixel_name, []).append(cache.add(media_key(pixels, grid), lambda p=pixels, g=grid: features(visual, p, g)))
        cache.add_sample(refs)
    unique = cache.close()
    return StageResult(
        outputs={"features": "features"},
        metrics={"unique_media": unique, "samples": len(data)},
        notes=[f"cached {what} of {unique} unique images/videos for {len(data)} samples"],
    )
