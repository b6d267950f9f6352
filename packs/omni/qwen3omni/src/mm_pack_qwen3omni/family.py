"""The Qwen3-Omni thinker as the VLM kit sees it: model and config classes, the state-dict
adapter, the media fields (vision patches and audio mel frames), M-RoPE positions for packed
rows across modalities, the thinker's own export config, the frozen-towers cache with DeepStack.
The kit (:mod:`mmcore.kits.vlm`) does preprocessing, collation, loss (with the router's
load-balancing term), training and export.

Compared with Qwen2.5-Omni: Qwen3-VL's vision tower (16-pixel patches, DeepStack features into
the first decoder layers), an audio tower that reads 1 s windows (any clip length), a MoE text
model whose hub checkpoints hold one tensor per expert, and a time axis in seconds x
``position_id_per_seconds`` (fractional positions for a video sampled at 4 fps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import Field

from mmcore.config import RunConfig
from mmcore import StageContext
from mmcore.engines import FusedExpertsAdapter
from mmcore.data import write_shape_tone_questions
from mmcore.kits import collate_mel_clips, mel_tower_tokens, use_cached_audio, VLMFamily, rows_of
from mmcore import Manifest
from mm_qwen_vision import QWEN_MEDIA_FIELDS, QwenVisionData, packed_mrope_positions

from mm_pack_qwen3omni.data import audio_tokens


class Qwen3OmniData(QwenVisionData):
    """The Qwen vision data options with Qwen3's 32-pixel merged patches as the unit."""

    image_min_pixels: int = Field(64 * 64, ge=32 * 32, description="Images smaller than this are upscaled.")
    image_max_pixels: int = Field(512 * 32 * 32, ge=32 * 32, description="Images larger than this are downscaled.")
    video_max_pixels: int = Field(128 * 32 * 32, ge=32 * 32, description="Pixel budget of each video frame.")


class Qwen3OmniConfig(RunConfig):
    data: Qwen3OmniData = Field(default_factory=Qwen3OmniData)


# The released checkpoints hold the thinker under ``thinker.`` beside the talker and the
# code2wav vocoder (left out); a thinker saved alone has no prefix. Both name the language
# model ``model.*`` and store one tensor per expert; in memory the parts nest under
# ``model.language_model.*``, ``model.audio_tower.*`` and ``model.visual.*`` with fused experts.
ADAPTER = FusedExpertsAdapter(
    rules=[
        # hub pattern, model replacement, model pattern, hub replacement
        (r"^(thinker\.)?audio_tower\.", "model.audio_tower.", r"^model\.audio_tower\.", "audio_tower."),
        (r"^(thinker\.)?visual\.", "model.visual.", r"^model\.visual\.", "visual."),
        (r"^(thinker\.)?model\.", "model.language_model.", r"^model\.language_model\.", "model."),
        (r"^(thinker\.)?lm_head\.", "lm_head.", r"^lm_head\.", "lm_head."),
    ],
    ignore=[r"^talker\.", r"^code2wav\."],
    per_expert=True,
    hidden_of=r"^(thinker\.)?model\.embed_tokens\.weight$",  # not the talker's
)

MEDIA_FIELDS = (*QWEN_MEDIA_FIELDS, "video_second_per_grid")
PACKED_COUNTS = {"segment_images": "image_grid_thw", "segment_videos": "video_grid_thw", "segment_audios": "audio_feature_lengths"}

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "audio": ["model.audio_tower.*"],
    "vision": ["model.visual.patch_embed.*", "model.visual.pos_embed.*", "model.visual.blocks.*"],
    "projector": ["model.visual.merger.*", "model.visual.merger_list.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from transformers import Qwen3OmniMoeThinkerConfig, WhisperFeatureExtractor

    from mm_pack_qwen3omni.data import Encoder

    config = Qwen3OmniMoeThinkerConfig.from_pretrained(model_dir)
    return Encoder(
        tokenizer,
        WhisperFeatureExtractor.from_pretrained(model_dir),
        ctx.config.data,
        merge_size=config.vision_config.spatial_merge_size,
        patch_size=config.vision_config.patch_size,
        n_window=config.audio_config.n_window,
    )


def packed_positions(model: Any, batch: dict[str, Any]) -> Any:
    """Each packed sample's positions from the model's own ``get_rope_index`` (audio advances
    like text; images and videos on their grids and time axis)."""
    import torch

    def rope_index(tokens: slice, rows: dict[str, Any]) -> Any:
        ids = batch["input_ids"][:, tokens]
        pos, _ = model.model.get_rope_index(
            ids, rows["image_grid_thw"], rows["video_grid_thw"], torch.ones_like(ids), audio_seqlens=rows["audio_feature_lengths"], second_per_grids=rows["video_second_per_grid"]
        )
        return pos

    return packed_mrope_positions(batch, PACKED_COUNTS, rope_index, follows={"video_second_per_grid": "video_grid_thw"})


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if ctx.plugins is not None:
        from mm_qwen_vision.kernels import apply_kernels

        apply_kernels(model, ctx.plugins.registry, ctx.accelerator.name, "qwen3omni")
    if "extract" in upstream:
        from mmcore.data import FeatureCache
        from mm_qwen_vision.deepstack import use_cached_deepstack_vision

        towers = FeatureCache(upstream["extract"].output("features")).index["towers"]
        if "audio" in towers:
            use_cached_audio(model.model)
        if "vision" in towers:
            use_cached_deepstack_vision(model.model.visual)


FAMILY = VLMFamily(
    # A full Omni folder's config nests the thinker's; Qwen3OmniMoeThinkerConfig reads either (and exports write it alone).
    model_class="Qwen3OmniMoeThinkerForConditionalGeneration",
    config_class="Qwen3OmniMoeThinkerConfig",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=MEDIA_FIELDS,
    tokens={"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>", "audio_token_id": "<|audio_pad|>"},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.audio_tower.layers", "model.visual.blocks", "model.language_model.layers"),
    model_inputs=("input_features", "feature_attention_mask"),
    packed_counts=PACKED_COUNTS,
    packed_positions=packed_positions,
    collate_extra=collate_mel_clips,
    prepare_model=prepare_model,
    cache_replaces={"audio_states": "input_features"},
    towers={"model.visual": rows_of("pixel_values", "pixel_values_videos"), "model.audio_tower": mel_tower_tokens(audio_tokens)},
    demo=write_shape_tone_questions,
    end_token="<|im_end|>",
)
