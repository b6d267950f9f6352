"""DeepSeek-OCR as the VLM kit sees it: the composed model (:mod:`.model`), the public names
(:mod:`.names`), the reference's image preparation (:mod:`.processing`) as the image expander.
The kit (:mod:`mmcore.kits.vlm`) does preprocessing, collation, packing, loss, training and export.

The decoder is DeepSeek-V2-style MoE (a dense first layer, then routed top-k experts beside
shared experts) with 1-D RoPE, so packed rows restart their positions per sample and need
nothing family-specific. transformers' DeepSeek-V2 MoE has no router load-balancing loss (no
``router_aux_loss_coef``), so none is added.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from mmcore import StageContext
from mmcore.config import RunConfig
from mmcore.data import MLLMDataSection, write_shape_preferences, write_shape_questions
from mmcore.kits import VLMFamily
from mm_pack_deepseek_ocr.names import ADAPTER

IMAGE = "<image>"


class DeepseekOcrData(MLLMDataSection):
    """MLLM JSON options plus the reference's resolution mode (``base_size``, ``image_size``, ``crop_mode``)."""

    base_size: int | None = Field(None, ge=16, description="Global view size in pixels (the reference's base_size); unset: Gundam's 1024 scaled to the model's SAM patch (64 patches).")
    image_size: int | None = Field(None, ge=16, description="Tile size in crop mode, else the one view's size (the reference's image_size); unset: Gundam's 640 scaled (40 patches).")
    crop_mode: bool = Field(True, description="Cut images larger than a tile into tiles beside the global view (Gundam); off: one view of image_size (Tiny 512, Small 640, Base 1024, Large 1280).")
    image_min_tiles: int = Field(2, ge=1, description="At least this many tiles for an image that is cut (the reference's min_num).")
    image_max_tiles: int = Field(9, ge=1, description="At most this many tiles per image (the reference's max_num: 9 in its infer, 6 in its vLLM config).")


class DeepseekOcrRunConfig(RunConfig):
    data: DeepseekOcrData = Field(default_factory=DeepseekOcrData)


# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["model.sam_model.*", "model.vision_model.*"],
    "projector": ["model.projector.*", "model.image_newline", "model.view_seperator"],
    "llm": ["model.language_model.*", "lm_head.*"],
}

# LoRA's default layers: the decoder's attention and MLP projections (the dense layer's, the
# shared experts'); not the router (``mlp.gate``) nor the fused routed experts (3-D parameters).
LORA_TARGETS = ("model.language_model.layers.*.self_attn.*_proj", "model.language_model.layers.*.mlp.*_proj", "model.language_model.layers.*.mlp.shared_experts.*_proj")


def images_of(ctx: StageContext, model_dir: Path, token_id: int) -> Any:
    """The image expander of the run's data section on the model's geometry."""
    from mm_pack_deepseek_ocr.model import DeepseekOcrConfig
    from mm_pack_deepseek_ocr.processing import OcrImages

    patch = int(DeepseekOcrConfig.from_pretrained(model_dir).sam_config.patch_size)
    data = ctx.config.data
    base, tile = data.base_size or 64 * patch, data.image_size or 40 * patch
    return OcrImages(token_id, patch, base, tile, data.crop_mode, data.image_min_tiles, data.image_max_tiles)


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mmcore.data import ChatTemplateEncoder

    from mm_pack_deepseek_ocr.tiny import CHAT_TEMPLATE

    image_id = tokenizer.convert_tokens_to_ids(IMAGE)
    images = images_of(ctx, model_dir, image_id)
    return ChatTemplateEncoder(
        tokenizer,
        {IMAGE: images},
        markers={IMAGE: IMAGE},
        chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
        train_on_prompt=ctx.config.data.train_on_prompt,
        media_token_ids=[image_id],
    )


def tile_grid(batch: dict[str, Any], samples: list[dict[str, Any]], ids: Any) -> None:
    """``images_spatial_crop`` as integers (stored samples hold arrays as floats)."""
    if "images_spatial_crop" in batch:
        batch["images_spatial_crop"] = batch["images_spatial_crop"].long()


def sam_patches(batch: dict[str, Any]) -> float:
    """Patches through the DeepEncoder (global views and tiles), counted in the released 16-pixel
    patches: the tiny presets' smaller views make this a relative measure there."""
    views = [batch[name] for name in ("pixel_values", "pixel_values_local") if batch.get(name) is not None]
    return float(sum(v.shape[0] * (v.shape[-1] // 16) * (v.shape[-2] // 16) for v in views))


def prepare_model(ctx: StageContext, model: Any, upstream: Any) -> None:
    """Crop mode on several ranks: every micro-batch calls the towers for tiles (see ``DeepseekOcrModel.always_tiles``)."""
    import torch.distributed as dist

    model.model.always_tiles = bool(ctx.config.data.crop_mode and dist.is_initialized() and dist.get_world_size() > 1)


class DeepseekOcrFamily(VLMFamily):
    """The kit's family on the pack's own model class and config (no transformers class exists)."""

    def config(self, model_dir: Path) -> Any:
        from mm_pack_deepseek_ocr.model import DeepseekOcrConfig

        return DeepseekOcrConfig.from_pretrained(model_dir)

    def model_type(self, config: Any) -> Any:
        from mm_pack_deepseek_ocr.model import DeepseekOcrForCausalLM

        return DeepseekOcrForCausalLM


FAMILY = DeepseekOcrFamily(
    model_class="DeepseekOcrForCausalLM",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=("pixel_values", "images_spatial_crop", "pixel_values_local"),
    tokens={"image_token_id": IMAGE},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.sam_model.layers", "model.vision_model.transformer.layers", "model.language_model.layers"),
    collate_extra=tile_grid,
    prepare_model=prepare_model,
    towers={"model.sam_model": sam_patches},
    demo=write_shape_questions,
    preference_demo=write_shape_preferences,
    lora_targets=LORA_TARGETS,
)
