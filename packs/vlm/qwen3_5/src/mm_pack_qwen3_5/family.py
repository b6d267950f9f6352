"""Qwen3.5 (dense and MoE) as the VLM kit sees it: the model classes, the state-dict adapter, the data options,
the frozen-vision cache and packing. The kit (:mod:`mmcore.kits.vlm`) does preprocessing,
collation, loss, training and export.

Compared with Qwen3-VL: the same processor (``Qwen3VLProcessor``: 16-pixel patches, mean/std
0.5, ``<t seconds>`` before each temporal patch of a video) and the same vision tower without
DeepStack; the text model is hybrid, three Gated DeltaNet (linear attention) layers to one
gated full-attention layer, with a partial M-RoPE (a quarter of each head rotates) and
zero-centred RMSNorms (``1 + weight``). The linear-attention layers carry a recurrent state
and a causal convolution along the row, so packed rows run them per sample
(:mod:`mm_pack_qwen3_5.packing`). The MoE text model puts a shared expert (with its own sigmoid
gate) beside the routed experts, which transformers 5 keeps fused (``gate_up_proj`` / ``down_proj``) and its checkpoints store per expert;
the router's load-balancing loss is the kit's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import Field

from mmcore import Manifest, StageContext
from mmcore.config import RunConfig
from mmcore.engines import FusedExpertsAdapter, remote_code
from mmcore.kits import VLMFamily
from mm_qwen_vision import QwenVisionData
from mm_qwen_vision.family import qwen_vision_fields

PATCH = 16
MEAN_STD = (0.5, 0.5)  # the image processor's image_mean / image_std, every channel


class Qwen3_5Data(QwenVisionData):
    """The Qwen vision data options with Qwen3.5's 32-pixel merged patches as the unit."""

    image_min_pixels: int = Field(64 * 64, ge=32 * 32, description="Images smaller than this are upscaled.")
    image_max_pixels: int = Field(512 * 32 * 32, ge=32 * 32, description="Images larger than this are downscaled.")
    video_max_pixels: int = Field(128 * 32 * 32, ge=32 * 32, description="Pixel budget of each video frame.")


class Qwen3_5Config(RunConfig):
    data: Qwen3_5Data = Field(default_factory=Qwen3_5Data)


# Hub names are the model's; the released checkpoints also hold a multi-token-prediction head
# (`mtp.*`), which transformers' model does not have and does not load: left out here too. MoE
# checkpoints store one tensor per expert (as transformers' save_pretrained writes them and
# from_pretrained fuses them): stacked on the way in, split again on the way out.
ADAPTER = FusedExpertsAdapter(ignore=[r"^mtp\."], per_expert=True)

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["model.visual.patch_embed.*", "model.visual.pos_embed.*", "model.visual.blocks.*"],
    "projector": ["model.visual.merger.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}

# LoRA's default layers: the attention projections of both layer kinds and the MLPs' (the MoE
# shared expert's); not the Gated DeltaNet's per-head gate inputs (in_proj_a / in_proj_b: one
# output per value head), nor the router and the shared expert's gate.
LORA_TARGETS = (
    "model.language_model.layers.*.self_attn.*",
    "model.language_model.layers.*.linear_attn.in_proj_qkv",
    "model.language_model.layers.*.linear_attn.in_proj_z",
    "model.language_model.layers.*.linear_attn.out_proj",
    "model.language_model.layers.*.mlp.*_proj",
)


def model_class(config: Any) -> Any:
    import transformers

    return transformers.Qwen3_5MoeForConditionalGeneration if config.model_type == "qwen3_5_moe" else transformers.Qwen3_5ForConditionalGeneration


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from transformers import AutoConfig

    from mm_qwen_vision.qwen3vl_processor import Qwen3VLEncoder

    vision = AutoConfig.from_pretrained(model_dir, **remote_code()).vision_config
    return Qwen3VLEncoder(tokenizer, ctx.config.data, MEAN_STD, merge_size=vision.spatial_merge_size, patch_size=vision.patch_size)


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if ctx.config.training.packing:
        from mm_pack_qwen3_5.packing import isolate_linear_attention

        isolate_linear_attention(model)
    if "extract" in upstream:
        from mm_qwen_vision import use_cached_vision

        use_cached_vision(model.model.visual)


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
    from mm_qwen_vision.extract import extract_vision

    return extract_vision(ctx, upstream, FAMILY)


FAMILY = VLMFamily(
    **qwen_vision_fields(
        model_class=model_class,
        encoder=encoder,
        adapter=ADAPTER,
        freeze_groups=FREEZE_GROUPS,
        prepare_model=prepare_model,
        lora_targets=LORA_TARGETS,
    )
)
