"""Qwen2-VL's side of training: build the model, batch -> summed loss, what to shard and freeze."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mmcore.causal_lm import count_loss_tokens, evaluate_accuracy, next_token_loss_sum, packed_rows, padded_rows
from mmcore.context import StageContext
from mmcore.data.shards import ShardDataset
from mmcore.rundir import Manifest
from mmcore.train import TrainRecipe

from mm_pack_qwen2vl.modeling import build_model, use_cached_vision

MEDIA_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
PACKED_COUNTS = {"segment_images": "image_grid_thw", "segment_videos": "video_grid_thw"}

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["model.visual.patch_embed.*", "model.visual.blocks.*"],
    "projector": ["model.visual.merger.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


@dataclass(frozen=True)
class TokenIds:
    """The token ids collation needs, as preprocess recorded them in the dataset index."""

    pad: int
    image: int
    video: int

    @classmethod
    def of(cls, data: ShardDataset) -> "TokenIds":
        index = data.index
        return cls(int(index["pad_id"]), int(index["image_token_id"]), int(index["video_token_id"]))


def collate(samples: list[dict[str, Any]], ids_: TokenIds, pack: bool = False) -> dict[str, Any]:
    """Token rows plus media patches concatenated in sample order (as the processor does).

    Rows are right-padded, or with ``pack`` one row without padding whose ``segments`` keep the
    samples' lengths. ``mm_token_type_ids`` (0 text, 1 image, 2 video) places media for M-RoPE.
    The first token of every sample is <|im_start|>, never supervised: no loss crosses samples.
    """
    import torch

    batch = packed_rows(samples, PACKED_COUNTS) if pack else padded_rows(samples, ids_.pad)
    ids, labels = batch["input_ids"], batch["labels"]
    batch["mm_token_type_ids"] = (ids == ids_.image).long() + 2 * (ids == ids_.video).long()
    for name in MEDIA_FIELDS:
        parts = [s[name] for s in samples if name in s]
        if parts:
            batch[name] = torch.cat(parts)
    batch["num_loss_tokens"] = count_loss_tokens(labels)
    return batch


def packed_position_ids(model: Any, batch: dict[str, Any]) -> Any:
    """M-RoPE positions restarted per sample, with 1-D text positions first ([4, 1, total]).

    transformers reads the restarts in the text positions to isolate the samples' attention.
    """
    import torch

    inner = model.model
    parts = []
    image_at = video_at = start = 0
    for length, n_img, n_vid in zip(batch["segments"].tolist(), batch["segment_images"].tolist(), batch["segment_videos"].tolist()):
        sl = slice(start, start + length)
        grids_i = batch["image_grid_thw"][image_at : image_at + n_img] if n_img else None
        grids_v = batch["video_grid_thw"][video_at : video_at + n_vid] if n_vid else None
        if n_img or n_vid:
            pos, _ = inner.get_rope_index(batch["input_ids"][:, sl], batch["mm_token_type_ids"][:, sl], image_grid_thw=grids_i, video_grid_thw=grids_v)
        else:
            pos = torch.arange(length, device=batch["input_ids"].device).view(1, 1, -1).expand(3, 1, -1)
        text = torch.arange(length, device=pos.device).view(1, 1, -1)
        parts.append(torch.cat([text, pos]))
        image_at, video_at, start = image_at + n_img, video_at + n_vid, start + length
    return torch.cat(parts, dim=2)


def forward_logits(model: Any, batch: dict[str, Any]) -> Any:
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "mm_token_type_ids", *MEDIA_FIELDS) if k in batch}
    if "segments" in batch:
        inputs["position_ids"] = packed_position_ids(model, batch)
    return model(**inputs, use_cache=False).logits


def loss_sum(model: Any, batch: dict[str, Any]) -> Any:
    return next_token_loss_sum(forward_logits(model, batch), batch["labels"])


def shard_modules(model: Any) -> list[Any]:
    inner = model.model
    return [*inner.visual.blocks, *inner.language_model.layers]


def apply_kernels(model: Any, registry: Any, device: str) -> list[str]:
    """Route the model's RMSNorms through this device's fused kernel, if it has one.

    Returns the names of the modules changed (none where the reference is what runs: the
    transformers implementation is then used as is, and the parity tests hold them equal).
    """
    import functools

    spec = registry.kernel_spec("qwen2vl.rms_norm", device)
    if spec.device == "reference":
        return []
    kernel = spec.load()
    changed = []
    for name, module in model.named_modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = functools.partial(lambda m, x: kernel(x, m.weight, m.variance_epsilon), module)
            changed.append(name)
    return changed


def model_dir(upstream: Mapping[str, Manifest]) -> Path:
    return upstream["download"].output("model")


def recipe(ctx: StageContext, upstream: Mapping[str, Manifest]) -> TrainRecipe:
    """The train engine's recipe; with a finished extract stage, vision features come from its cache."""
    ids_ = TokenIds.of(ShardDataset(upstream["preprocess"].output("dataset")))
    packing = ctx.config.training.packing
    cached = "extract" in upstream

    def load(split_name: str) -> Any:
        data = ShardDataset(upstream["preprocess"].output("dataset")).split(split_name)
        if cached:
            from mmcore.data.feature_cache import CachedSamples

            return CachedSamples(data, upstream["extract"].output("features"))
        return data

    def build(ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        model = build_model(model_dir(upstream), upstream["convert"].output("checkpoint"))
        if ctx.plugins is not None:
            apply_kernels(model, ctx.plugins.registry, ctx.accelerator.name)
        if cached:
            use_cached_vision(model)
        return model

    return TrainRecipe(
        build_model=build,
        dataset=lambda ctx, upstream: load("train"),
        collate=lambda samples: collate(samples, ids_, pack=packing),
        loss=loss_sum,
        shard_modules=shard_modules,
        freeze_groups=FREEZE_GROUPS,
        evaluate=lambda ctx, model, step: evaluate(ctx, model, load("eval"), ids_),
    )


def evaluate(ctx: StageContext, model: Any, held_out: Any, ids_: TokenIds) -> dict[str, float]:
    return evaluate_accuracy(ctx, model, held_out, lambda sample: collate([sample], ids_), forward_logits)
