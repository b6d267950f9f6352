"""What every pack on the Qwen vision tower declares alike in its :class:`~mmcore.kits.VLMFamily`
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V): written once here, each pack adding its own."""

from __future__ import annotations

from typing import Any


def qwen_vision_fields(**own: Any) -> dict[str, Any]:
    """The shared ``VLMFamily`` fields, ``own`` added or put in their place: the media fields and
    placeholders, the tower's and the language model's layers as FSDP2 shards them, M-RoPE
    positions and token types for packing, the tower's frames split under Ulysses, the tower cache (rows of ``pixel_values`` /
    ``pixel_values_videos``), the shape demos, and ChatML's end of turn."""
    from mmcore.data import write_shape_preferences, write_shape_questions
    from mmcore.kits import rows_of
    from mm_qwen_vision import QWEN_MEDIA_FIELDS, QWEN_PACKED_COUNTS, mm_token_types, rope_index_positions

    return {
        "media_fields": QWEN_MEDIA_FIELDS,
        "tokens": {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"},
        "shard_layers": ("model.visual.blocks", "model.language_model.layers"),
        "model_inputs": ("mm_token_type_ids",),
        "packed_counts": QWEN_PACKED_COUNTS,
        "packed_positions": rope_index_positions,
        "collate_extra": mm_token_types,
        "towers": {"model.visual": rows_of("pixel_values", "pixel_values_videos")},
        "frame_towers": ("model.visual",),
        "demo": write_shape_questions,
        "preference_demo": write_shape_preferences,
        "end_token": "<|im_end|>",
        **own,
    }


__all__ = ["qwen_vision_fields"]
