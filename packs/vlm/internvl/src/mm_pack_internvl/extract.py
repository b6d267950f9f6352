"""Extract (optional): with the vision tower frozen, run the InternViT once per tile and train
from its outputs. Features are what ``get_image_features`` reads from the tower (the output of
``vision_feature_layer``), so the pixel shuffle and the projector still run, and train. They are
stored per tile, keyed by the tile's content hash (a tile seen twice is encoded once); the
stage's fingerprint covers the vision weights and the preprocessing.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

from mmcore import StageContext
from mmcore.data import FeatureCacheWriter, ShardDataset
from mmcore import StageResult, Manifest

from mm_pack_internvl.family import FAMILY, vision_features


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    if "vision" not in ctx.config.training.freeze:
        return None  # the vision tower trains: nothing to cache
    model = FAMILY.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    data = ShardDataset(upstream["preprocess"].output("dataset")).with_fillers()  # fillers read the cache as samples do
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        tiles = data[i].get("pixel_values")
        refs = [] if tiles is None else [cache.add(hashlib.sha256(tile.contiguous().numpy().tobytes()).hexdigest(), lambda t=tile: vision_features(model, t[None])) for tile in tiles]
        cache.add_sample({"pixel_values": refs} if refs else {})
    unique = cache.close()
    return StageResult(outputs={"features": "features"}, metrics={"unique_media": unique, "samples": len(data)}, notes=[f"cached vision features of {unique} unique tiles for {len(data)} samples"])
