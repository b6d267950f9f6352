"""Extract (optional): with the vision tower frozen, run it once and train from its outputs.

Features are the vision blocks' outputs *before* the merger (the projector), so the projector
still trains. They are stored in safetensors shards keyed by the content hash of the pixels and
grid (identical images are encoded once); the stage's fingerprint already covers the vision
weights and the preprocessing, so a changed encoder or image setting makes a new cache.
"""

from __future__ import annotations

from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.data.qwen_vision import media_key, split_items
from mmcore.data.shards import ShardDataset, ShardWriter
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

MEDIA = (("pixel_values", "image_grid_thw", "image_features"), ("pixel_values_videos", "video_grid_thw", "video_features"))


def vision_frozen(ctx: StageContext) -> bool:
    return "vision" in ctx.config.training.freeze


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    import torch

    from mm_pack_qwen2vl.model import build_model

    if not vision_frozen(ctx):
        return None  # the vision tower trains: nothing to cache
    model = build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    visual = model.model.visual
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    writer = ShardWriter(ctx.stage_dir / "features")
    keys: dict[str, int] = {}
    per_sample: list[dict[str, list[str]]] = []
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample = data[i]
        refs: dict[str, list[str]] = {}
        for pixel_name, grid_name, feature_name in MEDIA:
            if pixel_name not in sample:
                continue
            for pixels, grid in split_items(sample[pixel_name], sample[grid_name]):
                key = media_key(pixels, grid)
                if key not in keys:
                    with torch.no_grad():
                        hidden = visual(pixels.to(visual.dtype), grid_thw=grid).last_hidden_state
                    keys[key] = writer.add({"features": hidden.float()}, length=len(hidden), meta={"key": key})
                refs.setdefault(feature_name, []).append(key)
        per_sample.append(refs)
    writer.close(by_key=keys, samples_media=per_sample)
    return StageResult(
        outputs={"features": "features"},
        metrics={"unique_media": len(keys), "samples": len(data)},
        notes=[f"cached vision features of {len(keys)} unique images/videos for {len(data)} samples"],
    )


class CachedFeatures:
    """The preprocessed dataset with media pixels replaced by cached vision features."""

    def __init__(self, data: ShardDataset, features: ShardDataset) -> None:
        self.data = data
        self.features = features
        self.by_key = features.index["by_key"]
        self.media = features.index["samples_media"]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        sample = dict(self.data[i])
        refs = self.media[self.data.indices[i]]
        for pixel_name, _, feature_name in MEDIA:
            if feature_name in refs:
                sample[pixel_name] = torch.cat([self.features[self.by_key[k]]["features"] for k in refs[feature_name]])
        return sample


def use_cached_vision(model: Any) -> Any:
    """Make the vision tower take cached block outputs and apply only the merger (projector)."""
    from mmcore.data.qwen_vision import use_cached_vision as merger_only

    merger_only(model.model.visual)
    return model
