"""Qwen3-VL (dense and MoE) as the VLM kit sees them: model classes, the state-dict adapter, the
data options, DeepStack in the frozen-vision cache, the router's auxiliary loss. The kit
(:mod:`mmcore.kits.vlm`) does preprocessing, collation, packing, loss, training and export.

Compared with Qwen2-VL: 16-pixel patches normalised to [-1, 1]; videos carry a ``<t seconds>``
text before each temporal patch's tokens; the vision tower also hands features of some of its
blocks (``deepstack_visual_indexes``, each through its own merger) to the first decoder layers;
the MoE text model stores its experts as fused 3-D tensors, transposed on the hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import Field

from mmcore.engines import FusedExpertsAdapter
from mmcore.config import RunConfig
from mmcore import StageContext
from mmcore.engines import remote_code
from mmcore.kits import VLMFamily
from mmcore import Manifest
from mm_qwen_vision import QwenVisionData
from mm_qwen_vision.family import qwen_vision_fields

PATCH = 16
MEAN_STD = (0.5, 0.5)  # Qwen3-VL's image_mean / image_std, every channel


class Qwen3VLData(QwenVisionData):
    """The Qwen vision data options with Qwen3-VL's 32-pixel merged patches as the unit."""

    image_min_pixels: int = Field(64 * 64, ge=32 * 32, description="Images smaller than this are upscaled.")
    image_max_pixels: int = Field(512 * 32 * 32, ge=32 * 32, description="Images larger than this are downscaled.")
    video_max_pixels: int = Field(128 * 32 * 32, ge=32 * 32, description="Pixel budget of each video frame.")


class Qwen3VLConfig(RunConfig):
    data: Qwen3VLData = Field(default_factory=Qwen3VLData)


# Hub names are the model's; MoE experts in either layout hubs hold (transformers 5 or earlier).
ADAPTER = FusedExpertsAdapter()

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["model.visual.patch_embed.*", "model.visual.pos_embed.*", "model.visual.blocks.*"],
    "projector": ["model.visual.merger.*", "model.visual.deepstack_merger_list.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


def model_class(config: Any) -> Any:
    import transformers

    return transformers.Qwen3VLMoeForConditionalGeneration if config.model_type == "qwen3_vl_moe" else transformers.Qwen3VLForConditionalGeneration


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from transformers import AutoConfig

    from mm_pack_qwen3vl.data import Encoder

    vision = AutoConfig.from_pretrained(model_dir, **remote_code()).vision_config
    return Encoder(tokenizer, ctx.config.data, merge_size=vision.spatial_merge_size, patch_size=vision.patch_size)


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if ctx.plugins is not None:
        from mm_qwen_vision.kernels import apply_kernels

        apply_kernels(model, ctx.plugins.registry, ctx.accelerator.name, "qwen3vl")
    if "extract" in upstream:
        from mm_qwen_vision.deepstack import use_cached_deepstack_vision

        use_cached_deepstack_vision(model.model.visual)


FAMILY = VLMFamily(
    **qwen_vision_fields(
        model_class=model_class,
        encoder=encoder,
        adapter=ADAPTER,
        freeze_groups=FREEZE_GROUPS,
        prepare_model=prepare_model,
    )
)
