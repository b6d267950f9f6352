"""Qwen2.5-Omni thinker's side of training: build the model, batch -> summed loss, packing
across modalities, what to shard and freeze.

A batch carries every sample's images, videos and audio clips in sample order: patches
concatenated as the processor does, and audio as ``input_features`` [clips, mels, frames]
zero-padded with ``feature_attention_mask`` (the tower reads only the valid frames). Packed
rows restart the 3-D M-RoPE positions per sample and put 1-D text positions first, from which
transformers builds an attention mask that keeps samples apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mmcore.causal_lm import count_loss_tokens, evaluate_accuracy, next_token_loss_sum, packed_rows, padded_rows
from mmcore.context import StageContext
from mmcore.data.shards import ShardDataset
from mmcore.rundir import Manifest
from mmcore.train import TrainRecipe

from mm_pack_qwen2_5omni.modeling import build_model, use_cached_towers

VISION_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "video_second_per_grid")
PACKED_COUNTS = {"segment_images": "image_grid_thw", "segment_videos": "video_grid_thw", "segment_audios": "audio_feature_lengths"}

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "audio": ["model.audio_tower.*"],
    "vision": ["model.visual.patch_embed.*", "model.visual.blocks.*"],
    "projector": ["model.visual.merger.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


@dataclass(frozen=True)
class TokenIds:
    pad: int
    image: int
    video: int
    audio: int

    @classmethod
    def of(cls, data: ShardDataset) -> "TokenIds":
        index = data.index
        return cls(int(index["pad_id"]), int(index["image_token_id"]), int(index["video_token_id"]), int(index["audio_token_id"]))


def collate(samples: list[dict[str, Any]], ids_: TokenIds, pack: bool = False) -> dict[str, Any]:
    import torch

    batch = packed_rows(samples, PACKED_COUNTS) if pack else padded_rows(samples, ids_.pad)
    for name in (*VISION_FIELDS, "audio_feature_lengths"):
        parts = [s[name] for s in samples if name in s]
        if parts:
            batch[name] = torch.cat(parts)
    if "audio_feature_lengths" in batch:
        lengths = batch.pop("audio_feature_lengths")
        batch["feature_attention_mask"] = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).long()
        if any("audio_states" in s for s in samples):  # the extract cache: the tower's outputs
            batch["input_features"] = torch.cat([s["audio_states"] for s in samples if "audio_states" in s])
        else:
            batch["input_features"] = pad_clips([s["input_features"] for s in samples if "input_features" in s], lengths)
    batch["num_loss_tokens"] = count_loss_tokens(batch["labels"])
    return batch


def pad_clips(frames: list[Any], lengths: Any) -> Any:
    """Per-sample [frames, mels] runs -> [clips, mels, longest] zero-padded, as the processor pads."""
    import torch

    flat = torch.cat(frames)
    out = torch.zeros(len(lengths), flat.shape[1], int(lengths.max()))
    for clip, run in enumerate(torch.split(flat, lengths.tolist())):
        out[clip, :, : len(run)] = run.T
    return out


def packed_position_ids(model: Any, batch: dict[str, Any]) -> Any:
    """M-RoPE positions restarted per sample, with 1-D text positions first ([4, 1, total])."""
    import torch

    inner = model.model
    audio_lengths = batch["feature_attention_mask"].sum(-1) if "feature_attention_mask" in batch else None
    parts = []
    image_at = video_at = audio_at = start = 0
    counts = zip(batch["segments"].tolist(), batch["segment_images"].tolist(), batch["segment_videos"].tolist(), batch["segment_audios"].tolist())
    for length, n_img, n_vid, n_aud in counts:
        sl = slice(start, start + length)
        if n_img or n_vid:
            pos, _ = inner.get_rope_index(
                batch["input_ids"][:, sl],
                image_grid_thw=batch["image_grid_thw"][image_at : image_at + n_img] if n_img else None,
                video_grid_thw=batch["video_grid_thw"][video_at : video_at + n_vid] if n_vid else None,
                audio_seqlens=audio_lengths[audio_at : audio_at + n_aud] if n_aud else None,
                second_per_grids=batch["video_second_per_grid"][video_at : video_at + n_vid] if n_vid else None,
            )
        else:  # text and audio only: audio positions advance like text
            pos = torch.arange(length, device=batch["input_ids"].device).view(1, 1, -1).expand(3, 1, -1)
        text = torch.arange(length, device=pos.device).view(1, 1, -1)
        parts.append(torch.cat([text, pos.to(text.dtype)]))
        image_at, video_at, audio_at, start = image_at + n_img, video_at + n_vid, audio_at + n_aud, start + length
    return torch.cat(parts, dim=2)


MODEL_INPUTS = ("input_ids", "attention_mask", "input_features", "feature_attention_mask", *VISION_FIELDS)


def forward_logits(model: Any, batch: dict[str, Any]) -> Any:
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if "segments" in batch:
        inputs["position_ids"] = packed_position_ids(model, batch)
    return model(**inputs, use_cache=False).logits


def loss_sum(model: Any, batch: dict[str, Any]) -> Any:
    return next_token_loss_sum(forward_logits(model, batch), batch["labels"])


def shard_modules(model: Any) -> list[Any]:
    inner = model.model
    return [*inner.audio_tower.layers, *inner.visual.blocks, *inner.language_model.layers]


def recipe(ctx: StageContext, upstream: Mapping[str, Manifest]) -> TrainRecipe:
    """The train engine's recipe; with a finished extract stage, frozen towers read its cache."""
    ids_ = TokenIds.of(ShardDataset(upstream["preprocess"].output("dataset")))
    packing = ctx.config.training.packing
    cached = "extract" in upstream

    def load(split: str) -> Any:
        data = ShardDataset(upstream["preprocess"].output("dataset")).split(split)
        if cached:
            from mmcore.data.feature_cache import CachedSamples

            return CachedSamples(data, upstream["extract"].output("features"), replaces={"audio_states": "input_features"})
        return data

    def build(ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        model = build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint"))
        if cached:
            use_cached_towers(model, ShardDataset(upstream["extract"].output("features")).index["towers"])
        return model

    return TrainRecipe(
        build_model=build,
        dataset=lambda ctx, upstream: load("train"),
        collate=lambda samples: collate(samples, ids_, pack=packing),
        loss=loss_sum,
        shard_modules=shard_modules,
        freeze_groups=FREEZE_GROUPS,
        evaluate=lambda ctx, model, step: evaluate_accuracy(ctx, model, load("eval"), lambda s: collate([s], ids_), forward_logits),
    )
