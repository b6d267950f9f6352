"""Extract (optional): with the vision tower frozen (``training.freeze=[vision]``), run SAM and the
query encoder once per view (global views and tiles) and train from their output: the queries'
features, what ``get_image_features`` reads from the tower; the projector and the view
separator still run, and train. Features are stored per view, keyed by the view's content hash
(a view seen twice is encoded once); the stage's fingerprint covers the vision weights and the
preprocessing.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from mmcore import Manifest, StageContext, StageResult
from mmcore.data import FeatureCacheWriter, ShardDataset

VIEWS = ("pixel_values", "pixel_values_local")


def vision_features(model: Any, view: Any) -> Any:
    """The tower's output for one view ([1, queries, encoder hidden])."""
    return model.model.vision_tower(view[None].to(model.dtype)).last_hidden_state


def use_cached_vision(model: Any) -> Any:
    """Make the vision tower hand back cached features: the projector and separator still run."""
    from transformers.modeling_outputs import BaseModelOutput

    def cached(pixel_values: Any, **kwargs: Any) -> Any:
        return BaseModelOutput(last_hidden_state=pixel_values)

    model.model.vision_tower.forward = cached
    return model


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    from mm_pack_deepseek_ocr2.family import FAMILY

    if "vision" not in ctx.config.training.freeze:
        return None  # the vision tower trains: nothing to cache
    model = FAMILY.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    data = ShardDataset(upstream["preprocess"].output("dataset")).with_fillers()  # fillers read the cache as samples do
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample, refs = data[i], {}
        for field in VIEWS:
            if sample.get(field) is not None:
                refs[field] = [cache.add(hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest(), lambda v=v: vision_features(model, v)) for v in sample[field]]
        cache.add_sample(refs)
    unique = cache.close()
    return StageResult(outputs={"features": "features"}, metrics={"unique_media": unique, "samples": len(data)}, notes=[f"cached vision features of {unique} unique views for {len(data)} samples"])
