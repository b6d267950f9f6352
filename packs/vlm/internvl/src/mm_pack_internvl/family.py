"""InternVL 3 / 3.5 (transformers format) as the VLM kit sees it: the model class, the data
options, the frozen-vision cache. The kit (:mod:`mmcore.kits.vlm`) does preprocessing,
collation, packing, loss, training and export; ``data.py`` turns images into InternVL's tiles.

InternVL's LLM is a plain causal decoder (Qwen2.5 or Qwen3) with 1-D positions, so packed rows
restart their positions per sample and need nothing family-specific. Every image becomes tiles
of ``vision_config.image_size`` (and a thumbnail when there are several), every tile
``image_seq_length`` ``<IMG_CONTEXT>`` tokens after the InternViT's pixel shuffle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import Field

from mmcore.config import RunConfig
from mmcore import StageContext
from mmcore.data import MLLMDataSection, write_shape_preferences, write_shape_questions
from mmcore.kits import TransformersNames, VLMFamily
from mmcore import Manifest


class InternVLData(MLLMDataSection):
    """MLLM JSON options plus InternVL's dynamic tiling and video sampling."""

    image_max_tiles: int = Field(12, ge=1, description="At most this many tiles per image (InternVL's max_dynamic_patch; a thumbnail is added when there are several).")
    image_min_tiles: int = Field(1, ge=1, description="At least this many tiles per image.")
    video_fps: float = Field(2.0, gt=0, description="Frames sampled per second of video (each frame one tile).")
    video_max_frames: int = Field(8, ge=1, description="At most this many frames per video.")


class InternVLRunConfig(RunConfig):
    data: InternVLData = Field(default_factory=InternVLData)


# transformers' own renaming (the -hf checkpoints' names, and the llava-style layout it maps)
ADAPTER = TransformersNames("InternVLForConditionalGeneration")

FREEZE_GROUPS = {
    "vision": ["model.vision_tower.*"],
    "projector": ["model.multi_modal_projector.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mm_pack_internvl.data import Encoder

    return Encoder(tokenizer, ctx.config.data, FAMILY.config(model_dir), model_dir)


def vision_patches(batch: dict[str, Any]) -> float:
    """Patch tokens through the InternViT: (image_size / patch_size)^2 per tile."""
    tiles = batch.get("pixel_values")
    return 0.0 if tiles is None else float(tiles.shape[0] * (tiles.shape[-1] // 14) * (tiles.shape[-2] // 14))


def use_cached_vision(model: Any) -> Any:
    """Make the vision tower hand back cached features (its output at ``vision_feature_layer``,
    ``extract.vision_features``); pixel shuffle and the projector still run, and train."""
    from transformers.modeling_outputs import BaseModelOutput

    tower = model.model.vision_tower
    layers = len(tower.encoder.layer) + 1

    def cached(pixel_values: Any, **kwargs: Any) -> Any:
        return BaseModelOutput(last_hidden_state=pixel_values, hidden_states=(pixel_values,) * layers)

    tower.forward = cached
    return model


def vision_features(model: Any, tiles: Any) -> Any:
    """The vision tower's output where ``get_image_features`` reads it ([tiles, tokens, hidden])."""
    layer = model.config.vision_feature_layer
    out = model.model.vision_tower(pixel_values=tiles.to(model.dtype), output_hidden_states=layer != -1, return_dict=True)
    return out.last_hidden_state if layer == -1 else out.hidden_states[layer]


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if "extract" in upstream:
        use_cached_vision(model)


FAMILY = VLMFamily(
    model_class="InternVLForConditionalGeneration",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=("pixel_values",),
    tokens={"image_token_id": "<IMG_CONTEXT>"},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.vision_tower.encoder.layer", "model.language_model.layers"),
    prepare_model=prepare_model,
    towers={"model.vision_tower": vision_patches},
    demo=write_shape_questions,
    preference_demo=write_shape_preferences,
    end_token="<|im_end|>",
)
