"""The extract stage of a Qwen-style vision tower (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V) and,
for the omni thinkers, their audio tower: with a tower frozen, run it once per unique image,
video or clip and train from its outputs.

What is cached is what the trained part after the tower reads: by default the vision tower's
``last_hidden_state`` (before the merger, the projector, which still trains); a family passes
``features`` where it reads more (Qwen3-VL's DeepStack blocks); audio clips cache the whole
audio tower's output. Features are stored in safetensors shards keyed by the content hash of
the input (identical media are encoded once); the stage's fingerprint covers the weights, the
preprocessing and ``training.freeze``, so a changed encoder, media setting or frozen set makes a
new cache.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mmcore import StageContext
from mmcore.data import FeatureCacheWriter, ShardDataset
from mmcore.kits import audio_clips, clip_key
from mmcore import StageResult, Manifest

from mm_qwen_vision import media_key, split_items

MEDIA = (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw"))


def tower_output(visual: Any, pixels: Any, grid: Any) -> Any:
    return visual(pixels.to(visual.dtype), grid_thw=grid).last_hidden_state


def audio_tower_output(inner: Any, frames: Any) -> Any:
    """The audio tower's output of one clip's [frames, mels] (``inner``: the model holding ``get_audio_features``)."""
    import torch

    mask = torch.ones(1, len(frames), dtype=torch.long)
    return inner.get_audio_features(frames.T[None], mask, return_dict=True).last_hidden_state


def extract_vision(
    ctx: StageContext, upstream: Mapping[str, Manifest], family: Any, features: Callable[[Any, Any, Any], Any] = tower_output, what: str = "vision features", audio: bool = False
) -> StageResult | None:
    """The stage: None (declined) unless ``training.freeze`` holds ``vision`` (or, with
    ``audio``, ``audio``).

    Args:
        family: the pack's :class:`~mmcore.kits.vlm.VLMFamily` (builds the converted model).
        features: ``(tower, pixels, grid[1, 3]) -> tensor`` of one image or video.
        what: how the notes name what was cached.
        audio: the model has an audio tower (``model.model.get_audio_features``) to cache too;
            the cache's index records which towers it holds (``towers``).
    """
    towers = [tower for tower in (("audio", "vision") if audio else ("vision",)) if tower in ctx.config.training.freeze]
    if not towers:
        return None  # every tower trains: nothing fixed to cache
    model = family.build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    inner = model.model
    data = ShardDataset(upstream["preprocess"].output("dataset")).with_fillers()  # fillers read the cache as samples do
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="sample"):
        sample = data[i]
        refs: dict[str, list[str]] = {}
        if "audio" in towers:
            for frames in audio_clips(sample):
                refs.setdefault("audio_states", []).append(cache.add(clip_key(frames), lambda f=frames: audio_tower_output(inner, f)))
        if "vision" in towers:
            for pixel_name, grid_name in MEDIA:
                for pixels, grid in split_items(sample.get(pixel_name, []), sample.get(grid_name, [])):
                    refs.setdefault(pixel_name, []).append(cache.add(media_key(pixels, grid), lambda p=pixels, g=grid: features(inner.visual, p, g)))
        cache.add_sample(refs)
    unique = cache.close(towers=towers)
    if audio:
        what = " and ".join(("audio tower outputs" if t == "audio" else what) for t in towers)
    return StageResult(
        outputs={"features": "features"},
        metrics={"unique_media": unique, "samples": len(data), "towers": towers},
        notes=[f"cached {what} of {unique} unique media for {len(data)} samples"],
    )
