"""The Qwen2.5-Omni thinker as the VLM kit sees it: model and config classes, the media fields
(vision patches and audio mel frames), M-RoPE positions for packed rows across modalities, the
thinker's own export config, the frozen-towers cache. The kit (:mod:`mmcore.kits.vlm`) does
preprocessing, collation, loss, training and export.

A batch carries every sample's images, videos and audio clips in sample order: patches
concatenated as the processor does, and audio as ``input_features`` [clips, mels, frames]
zero-padded with ``feature_attention_mask`` (the tower reads only the valid frames).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore import StageContext
from mmcore.data import write_shape_tone_questions
from mmcore.kits import collate_mel_clips, mel_tower_tokens, use_cached_audio, VLMFamily, rows_of
from mmcore import Manifest
from mm_qwen_vision import packed_mrope_positions

from mm_pack_qwen2_5omni.adapter import ADAPTER

VISION_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "video_second_per_grid")
PACKED_COUNTS = {"segment_images": "image_grid_thw", "segment_videos": "video_grid_thw", "segment_audios": "audio_feature_lengths"}

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "audio": ["model.audio_tower.*"],
    "vision": ["model.visual.patch_embed.*", "model.visual.blocks.*"],
    "projector": ["model.visual.merger.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from transformers import Qwen2_5OmniThinkerConfig, WhisperFeatureExtractor

    from mm_pack_qwen2_5omni.data import Encoder

    merge = Qwen2_5OmniThinkerConfig.from_pretrained(model_dir).vision_config.spatial_merge_size
    return Encoder(tokenizer, WhisperFeatureExtractor.from_pretrained(model_dir), ctx.config.data, merge_size=merge)


def packed_positions(model: Any, batch: dict[str, Any]) -> Any:
    def rope_index(tokens: slice, rows: dict[str, Any]) -> Any:
        if rows["image_grid_thw"] is None and rows["video_grid_thw"] is None:  # text and audio: audio advances like text
            import torch

            return torch.arange(tokens.stop - tokens.start, device=batch["input_ids"].device).view(1, 1, -1).expand(3, 1, -1)
        pos, _ = model.model.get_rope_index(
            batch["input_ids"][:, tokens],
            image_grid_thw=rows["image_grid_thw"],
            video_grid_thw=rows["video_grid_thw"],
            audio_seqlens=rows["audio_feature_lengths"],
            second_per_grids=rows["video_second_per_grid"],
        )
        return pos

    return packed_mrope_positions(batch, PACKED_COUNTS, rope_index, follows={"video_second_per_grid": "video_grid_thw"})


def use_cached_towers(model: Any, towers: list[str]) -> Any:
    """Make the frozen towers pass cached outputs through (the vision merger still runs)."""
    from mm_qwen_vision import use_cached_vision

    if "audio" in towers:
        use_cached_audio(model.model)
    if "vision" in towers:
        use_cached_vision(model.model.visual)
    return model


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if "extract" in upstream:
        from mmcore.data import FeatureCache

        use_cached_towers(model, FeatureCache(upstream["extract"].output("features")).index["towers"])


FAMILY = VLMFamily(
    # A full Omni folder's config nests the thinker's; Qwen2_5OmniThinkerConfig reads either (and exports write it alone).
    model_class="Qwen2_5OmniThinkerForConditionalGeneration",
    config_class="Qwen2_5OmniThinkerConfig",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=VISION_FIELDS,
    tokens={"image_token_id": "<|IMAGE|>", "video_token_id": "<|VIDEO|>", "audio_token_id": "<|AUDIO|>"},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.audio_tower.layers", "model.visual.blocks", "model.language_model.layers"),
    model_inputs=("input_features", "feature_attention_mask"),
    packed_counts=PACKED_COUNTS,
    packed_positions=packed_positions,
    collate_extra=collate_mel_clips,
    prepare_model=prepare_model,
    cache_replaces={"audio_states": "input_features"},
    towers={"model.visual": rows_of("pixel_values", "pixel_values_videos"), "model.audio_tower": mel_tower_tokens(lambda frames: frames / 2)},
    demo=write_shape_tone_questions,
    end_token="<|im_end|>",
)
