"""GLM-4.1V and GLM-4.5V (MoE) as the VLM kit sees them: the model class, GLM's token types, the frozen-vision cache.
The kit (:mod:`mmcore.kits.vlm`) does preprocessing, collation, packing, loss, training and
export; ``data.py`` writes GLM's image and video tokens.

GLM-4V takes Qwen2-VL-style vision input (14-pixel patches in temporal pairs, grids, M-RoPE from
the model's own ``get_rope_index``), but writes video frames with the image token: the token
types mark image tokens inside ``<|begin_of_video|> ... <|end_of_video|>`` as video, and since
transformers' model finds images and video frames by that one token, it cannot take both kinds
in one forward: samples with a video train and generate in batches of their own (the kit's
``batch_apart``), and one sample may hold images or videos, not both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import Field

from mmcore.config import RunConfig
from mmcore import StageContext
from mmcore.engines import FusedExpertsAdapter
from mmcore.kits import VLMFamily
from mmcore import StageResult, Manifest
from mm_qwen_vision import QwenVisionData, use_cached_vision
from mm_qwen_vision.family import qwen_vision_fields


class Glm4vRunConfig(RunConfig):
    data: QwenVisionData = Field(default_factory=QwenVisionData)


# hub names are the model's; GLM-4.5V's hub checkpoints store one tensor per expert
ADAPTER = FusedExpertsAdapter(per_expert=True)


def model_class(config: Any) -> Any:
    import transformers

    return transformers.Glm4vMoeForConditionalGeneration if config.model_type == "glm4v_moe" else transformers.Glm4vForConditionalGeneration


# training.freeze accepts these names as well as parameter globs; the cache holds what the merger reads
FREEZE_GROUPS = {
    "vision": ["model.visual.patch_embed.*", "model.visual.post_conv_layernorm.*", "model.visual.embeddings.*", "model.visual.blocks.*", "model.visual.post_layernorm.*", "model.visual.downsample.*"],
    "projector": ["model.visual.merger.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mm_pack_glm4v.data import Encoder

    return Encoder(tokenizer, ctx.config.data, FAMILY.config(model_dir).vision_config.spatial_merge_size)


def token_types(batch: dict[str, Any], samples: list[dict[str, Any]], ids: Mapping[str, int]) -> None:
    """``mm_token_type_ids``: image tokens are 1, or 2 between a video's begin and end tokens
    (``Glm4vProcessor.create_mm_token_type_ids``)."""
    tokens = batch["input_ids"]
    inside = (tokens == ids["video_start_id"]).cumsum(-1) > (tokens == ids["video_end_id"]).cumsum(-1)
    image = tokens == ids["image_token_id"]
    batch["mm_token_type_ids"] = (image & ~inside).long() + 2 * (image & inside).long()


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if ctx.plugins is not None:
        from mm_qwen_vision.kernels import apply_kernels

        apply_kernels(model, ctx.plugins.registry, ctx.accelerator.name, "glm4v", rotary=False)
    if "extract" in upstream:
        use_cached_vision(model.model.visual)  # the cache holds the downsampled tower output: the merger runs


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    from mm_qwen_vision.extract import extract_vision

    return extract_vision(ctx, upstream, FAMILY)


FAMILY = VLMFamily(
    **qwen_vision_fields(
        model_class=model_class,
        encoder=encoder,
        adapter=ADAPTER,
        tokens={"image_token_id": "<|image|>", "video_start_id": "<|begin_of_video|>", "video_end_id": "<|end_of_video|>"},
        freeze_groups=FREEZE_GROUPS,
        collate_extra=token_types,
        prepare_model=prepare_model,
        end_token="<|endoftext|>",
        batch_apart=("pixel_values_videos",),
        # peft (0.21) maps targets named gate/up/down_proj of GLM-4.5V onto its fused experts (its
        # transformers-4 adapter conversion), so LoRA adapts the attention by default
        lora_targets=("model.language_model.layers.*.self_attn.*",),
    )
)
