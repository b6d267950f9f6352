"""Extract (optional): with the vision tower frozen (``training.freeze=[vision]``), run MoonViT once
per image and train from its output: the merged groups of 2 x 2 patch features the projector
reads (``pooler_output``, [tokens, 4, vision hidden]); the projector still runs, and trains.
Features are stored per image, keyed by the content hash of its patches and grid (an image seen
twice is encoded once); the stage's fingerprint covers the vision weights and the preprocessing.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from mmcore import Manifest, StageContext, StageResult
from mmcore.data import FeatureCacheWriter, ShardDataset


def split_images(pixels: Any, grids: Any) -> list[tuple[Any, Any]]:
    """One (patches, grid[1, 3]) pair per image of a sample."""
    out, start = [], 0
    for grid in grids:
        n = int(grid.prod())
        out.append((pixels[start : start + n], grid[None]))
        start += n
    return out


def image_key(pixels: Any, grid: Any) -> str:
    digest = hashlib.sha256(grid.numpy().tobytes())
    digest.update(pixels.contiguous().numpy().tobytes())
    return digest.hexdigest()


def vision_features(model: Any, pixels: Any, grid: Any) -> Any:
    """The tower's merged patch groups for one image ([tokens, 4, vision hidden])."""
    tower = model.model.vision_tower
    return tower(pixels.to(model.dtype), grid_thw=grid).pooler_output


def use_cached_vision(model: Any) -> Any:
    """Make the vision tower hand back cached features: the projector still runs."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def cached(pixel_values: Any, grid_thw: Any = None, **kwargs: Any) -> Any:
        return BaseModelOutputWithPooling(last_hidden_state=pixel_values, pooler_output=pixel_values)

    model.model.vision_tower.forward = cached
    return model


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    from mm_pack_kimi_k25.family import FAMILY

    if "vision" not in ctx.config.training.freeze:
        return None  # the vision tower trains: nothing to cache
    model = FAMILY.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    data = ShardDataset(upstream["preprocess"].output("dataset")).with_fillers()  # fillers read the cache as samples do
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample, refs = data[i], {}
        for pixels, grid in split_images(sample.get("pixel_values", []), sample.get("image_grid_thw", [])):
            refs.setdefault("pixel_values", []).append(cache.add(image_key(pixels, grid), lambda p=pixels, g=grid: vision_features(model, p, g)))
        cache.add_sample(refs)
    unique = cache.close()
    return StageResult(outputs={"features": "features"}, metrics={"unique_media": unique, "samples": len(data)}, notes=[f"cached vision features of {unique} unique images for {len(data)} samples"])
