"""Extract (optional): with the understanding tower frozen (``training.freeze=[vision]``), run
it once per image and train from its patch features; the aligner still runs, and trains.
Features are stored per image, keyed by the pixels' content hash (an image seen twice is
encoded once); the stage's fingerprint covers the vision weights and the preprocessing.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from mmcore import Manifest, StageContext, StageResult
from mmcore.data import FeatureCacheWriter, ShardDataset


def vision_features(model: Any, pixels: Any) -> Any:
    """The tower's output for one image ([1, patches, vision hidden])."""
    return model.model.vision_model(pixels[None].to(model.dtype)).last_hidden_state


def use_cached_vision(model: Any) -> Any:
    """Make the understanding tower hand back cached features: the aligner still runs."""
    from transformers.modeling_outputs import BaseModelOutput

    def cached(pixel_values: Any, **kwargs: Any) -> Any:
        return BaseModelOutput(last_hidden_state=pixel_values)

    model.model.vision_model.forward = cached
    return model


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    from mm_pack_janus.family import FAMILY

    if "vision" not in ctx.config.training.freeze:
        return None  # the tower trains: nothing to cache
    model = FAMILY.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    data = ShardDataset(upstream["preprocess"].output("dataset")).with_fillers()  # fillers read the cache as samples do
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample, refs = data[i], {}
        if sample.get("pixel_values") is not None:
            refs["pixel_values"] = [cache.add(hashlib.sha256(p.contiguous().numpy().tobytes()).hexdigest(), lambda p=p: vision_features(model, p)) for p in sample["pixel_values"]]
        cache.add_sample(refs)
    unique = cache.close()
    return StageResult(outputs={"features": "features"}, metrics={"unique_media": unique, "samples": len(data)}, notes=[f"cached vision features of {unique} unique images for {len(data)} samples"])
