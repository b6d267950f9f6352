"""DeepSeek-VL2 as the VLM kit sees it: the composed model (:mod:`.model`), the public names
(:mod:`.names`), the tiling (:mod:`.processing`) as the image expander. The kit
(:mod:`mmcore.kits.vlm`) does preprocessing, collation, packing, loss, training and export.

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
from mm_pack_deepseek_vl2.names import ADAPTER

IMAGE = "<image>"


class DeepseekVL2Data(MLLMDataSection):
    """MLLM JSON options plus DeepSeek-VL2's dynamic tiling."""

    image_crop: bool = Field(
        True, description="Tile images by the best of candidate_resolutions beside the global view (the public processor does so in conversations of at most two images); off: one tile."
    )


class DeepseekVL2Config(RunConfig):
    data: DeepseekVL2Data = Field(default_factory=DeepseekVL2Data)


# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["vision.*"],
    "projector": ["projector.*", "image_newline", "view_seperator"],
    "llm": ["language.*"],
}

# LoRA's default layers: the decoder's attention and MLP projections (the dense layer's, the
# shared experts'); not the router (``mlp.gate``) nor the fused routed experts (3-D parameters).
LORA_TARGETS = ("language.model.layers.*.self_attn.*_proj", "language.model.layers.*.mlp.*_proj", "language.model.layers.*.mlp.shared_experts.*_proj")


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mmcore.data import ChatTemplateEncoder

    from mm_pack_deepseek_vl2.model import DeepseekVL2Config as ModelConfig
    from mm_pack_deepseek_vl2.processing import TiledImages
    from mm_pack_deepseek_vl2.tiny import CHAT_TEMPLATE

    image_id = tokenizer.convert_tokens_to_ids(IMAGE)
    images = TiledImages(ModelConfig.from_pretrained(model_dir), image_id, crop=ctx.config.data.image_crop)
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


def vision_patches(batch: dict[str, Any]) -> float:
    """Patches through the SigLIP tower (every view), counted in the released 14-pixel patches:
    the tiny presets' smaller views make this a relative measure there."""
    views = batch.get("pixel_values")
    return 0.0 if views is None else float(views.shape[0] * (views.shape[-1] // 14) * (views.shape[-2] // 14))


class DeepseekVL2Family(VLMFamily):
    """The kit's family on the pack's own model class and config (no transformers class exists)."""

    def config(self, model_dir: Path) -> Any:
        from mm_pack_deepseek_vl2.model import DeepseekVL2Config as ModelConfig

        return ModelConfig.from_pretrained(model_dir)

    def model_type(self, config: Any) -> Any:
        from mm_pack_deepseek_vl2.model import DeepseekVL2ForCausalLM

        return DeepseekVL2ForCausalLM


FAMILY = DeepseekVL2Family(
    model_class="DeepseekVL2ForCausalLM",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=("pixel_values", "images_spatial_crop"),
    tokens={"image_token_id": IMAGE},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("vision.encoder.layers", "language.model.layers"),
    collate_extra=tile_grid,
    towers={"vision": vision_patches},
    demo=write_shape_questions,
    preference_demo=write_shape_preferences,
    lora_targets=LORA_TARGETS,
)
