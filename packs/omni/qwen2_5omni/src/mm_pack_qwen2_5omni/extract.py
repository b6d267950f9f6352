"""Extract (optional): run the frozen towers once and train from their outputs.

With ``audio`` in ``training.freeze`` the audio tower's outputs per clip are cached (the whole
tower is frozen); with ``vision`` the vision blocks' outputs per image/video *before* the
merger (the projector keeps training). Items are keyed by the content hash of their input, so
a clip or image repeated in the data is encoded once; the stage's fingerprint covers the
weights, the preprocessing and ``training.freeze``.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from mmcore.context import StageContext
from mm_qwen_vision import media_key, split_items
from mmcore.data.feature_cache import FeatureCacheWriter
from mmcore.data.shards import ShardDataset
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

from mm_pack_qwen2_5omni.family import FAMILY

VISION = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def frozen_towers(ctx: StageContext) -> list[str]:
    return [tower for tower in ("audio", "vision") if tower in ctx.config.training.freeze]


def audio_clips(sample: dict[str, Any]) -> list[Any]:
    import torch

    return list(torch.split(sample["input_features"], sample["audio_feature_lengths"].tolist())) if "input_features" in sample else []


def clip_key(frames: Any) -> str:
    return hashlib.sha256(frames.contiguous().numpy().tobytes()).hexdigest()


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    import torch

    towers = frozen_towers(ctx)
    if not towers:
        return None  # both towers train: nothing fixed to cache
    model = FAMILY.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    inner = model.model
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample = data[i]
        refs: dict[str, list[str]] = {}
        if "audio" in towers:
            for frames in audio_clips(sample):
                mask = torch.ones(1, len(frames), dtype=torch.long)
                refs.setdefault("audio_states", []).append(cache.add(
                    clip_key(frames), lambda f=frames, m=mask: inner.get_audio_features(f.T[None], m, return_dict=True).last_hidden_state))
        if "vision" in towers:
            for pixel_name, grid_name in VISION:
                for pixels, grid in split_items(sample.get(pixel_name, []), sample.get(grid_name, [])):
                    refs.setdefault(pixel_name, []).append(cache.add(
                        media_key(pixels, grid), lambda p=pixels, g=grid: inner.visual(p, grid_thw=g).last_hidden_state))
        cache.add_sample(refs)
    unique = cache.close(towers=towers)
    return StageResult(
        outputs={"features": "features"},
        metrics={"unique_items": unique, "samples": len(data), "towers": towers},
        notes=[f"cached {' and '.join(towers)} tower outputs of {unique} unique items for {len(data)} samples"],
    )
