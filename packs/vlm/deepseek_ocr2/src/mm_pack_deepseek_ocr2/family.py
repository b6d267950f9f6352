"""DeepSeek-OCR-2 as the VLM kit sees it: the model class, the state-dict adapter, the processor
as the image expander, the frozen-vision cache. The kit (:mod:`mmcore.kits.vlm`) does
preprocessing, collation, packing, loss, training and export.

The family: a SAM ViT-B (windowed and global attention, relative positions) whose neck and two
stride-2 convolutions give a 12 x 12 (768-pixel tile) or 16 x 16 (1024-pixel global view) grid;
a Qwen2-style encoder reads that grid bidirectionally and 144 or 256 learnable queries after it
causally ("visual causal flow"); the queries' outputs, projected, are the image's tokens:
every local tile's, then the global view's, then a learned view separator. The decoder is
DeepSeek-V2-style MoE (a dense first layer, then routed top-k experts beside shared experts)
with 1-D RoPE, so packed rows restart their positions per sample and need nothing
family-specific. The router has no load-balancing loss in transformers' model (no
``router_aux_loss_coef``), so none is added.

The processor (``DeepseekOcr2Processor``, on its PIL image processor: no torchvision) expands
each ``<image>``: the count of tokens is its own, so preprocessing asks it per image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from mmcore import StageContext
from mmcore.config import RunConfig
from mmcore.data import MLLMDataSection, write_shape_preferences, write_shape_questions
from mmcore.engines import FusedExpertsAdapter
from mmcore.kits import VLMFamily


class DeepseekOcr2Data(MLLMDataSection):
    """MLLM JSON options plus DeepSeek-OCR-2's tiling of large images (the processor's crop mode)."""

    image_crop: bool = Field(True, description="Cut images larger than a tile into tiles beside the global view (the processor's crop_to_patches).")
    image_min_tiles: int = Field(2, ge=1, description="At least this many tiles for an image that is cut (the processor's min_patches).")
    image_max_tiles: int = Field(6, ge=1, description="At most this many tiles per image (the processor's max_patches).")


class DeepseekOcr2Config(RunConfig):
    data: DeepseekOcr2Data = Field(default_factory=DeepseekOcr2Data)


# Hub names are the released checkpoint's (deepseek-ai's layout: ``sam_model``, ``qwen2_model``,
# ``projector``, ``view_seperator``, one tensor per expert), which transformers renames on load
# and writes back on save_pretrained; names already in transformers' layout match no rule and
# load as they are. (hub pattern, model replacement, model pattern, hub replacement); first match wins.
SAM, ENC = "model.vision_tower.sam_encoder", "model.vision_tower.vision_encoder"
RULES = [
    (r"^model\.sam_model\.blocks\.(\d+)\.norm(\d)\.", rf"{SAM}.layers.\1.layer_norm\2.", rf"^{SAM}\.layers\.(\d+)\.layer_norm(\d)\.", r"model.sam_model.blocks.\1.norm\2."),
    (r"^model\.sam_model\.blocks\.", f"{SAM}.layers.", rf"^{SAM}\.layers\.", "model.sam_model.blocks."),
    (r"^model\.sam_model\.patch_embed\.proj\.", f"{SAM}.patch_embed.projection.", rf"^{SAM}\.patch_embed\.projection\.", "model.sam_model.patch_embed.proj."),
    (r"^model\.sam_model\.neck\.0\.", f"{SAM}.neck.conv1.", rf"^{SAM}\.neck\.conv1\.", "model.sam_model.neck.0."),
    (r"^model\.sam_model\.neck\.1\.", f"{SAM}.neck.layer_norm1.", rf"^{SAM}\.neck\.layer_norm1\.", "model.sam_model.neck.1."),
    (r"^model\.sam_model\.neck\.2\.", f"{SAM}.neck.conv2.", rf"^{SAM}\.neck\.conv2\.", "model.sam_model.neck.2."),
    (r"^model\.sam_model\.neck\.3\.", f"{SAM}.neck.layer_norm2.", rf"^{SAM}\.neck\.layer_norm2\.", "model.sam_model.neck.3."),
    (r"^model\.sam_model\.net_2\.", f"{SAM}.proj.conv1.", rf"^{SAM}\.proj\.conv1\.", "model.sam_model.net_2."),
    (r"^model\.sam_model\.net_3\.", f"{SAM}.proj.conv2.", rf"^{SAM}\.proj\.conv2\.", "model.sam_model.net_3."),
    (r"^model\.sam_model\.pos_embed$", f"{SAM}.pos_embed", rf"^{SAM}\.pos_embed$", "model.sam_model.pos_embed"),
    (r"^model\.qwen2_model\.model\.model\.", f"{ENC}.", rf"^{ENC}\.", "model.qwen2_model.model.model."),
    (r"^model\.qwen2_model\.query_(768|1024)\.", r"model.vision_tower.query_\1_resolution.", r"^model\.vision_tower\.query_(768|1024)_resolution\.", r"model.qwen2_model.query_\1."),
    (r"^model\.projector\.layers\.", "model.multi_modal_projector.", r"^model\.multi_modal_projector\.", "model.projector.layers."),
    (r"^model\.view_seperator$", "model.view_separator", r"^model\.view_separator$", "model.view_seperator"),
    (r"^model\.(embed_tokens|layers|norm)\.", r"model.language_model.\1.", r"^model\.language_model\.", "model."),
]


class DeepseekOcr2Names(FusedExpertsAdapter):
    r"""The rules above, and LoRA adapter keys under the hub's names: peft (with transformers 5)
    renames adapter keys by the family's conversion mapping on load, and transformers'
    ``(^|model\.)layers\.`` rule also matches inside ``model.language_model.layers.`` (it would
    load as ``language_model.language_model``): written as the released checkpoint names the
    decoder (``model.layers.``), they load where they belong."""

    def peft_name(self, model_key: str) -> str:
        return self._rename(model_key, False)


ADAPTER = DeepseekOcr2Names(rules=RULES, per_expert=True)

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["model.vision_tower.*"],
    "projector": ["model.multi_modal_projector.*", "model.view_separator"],
    "llm": ["model.language_model.*", "lm_head.*"],
}

# LoRA's default layers: the decoder's attention and MLP projections (the dense layer's, the
# shared experts'); not the router (``mlp.gate``) nor the fused routed experts (3-D parameters).
LORA_TARGETS = ("model.language_model.layers.*.self_attn.*_proj", "model.language_model.layers.*.mlp.*_proj", "model.language_model.layers.*.mlp.shared_experts.*_proj")


def processor(model_dir: Path) -> Any:
    """The family's processor on its PIL image processor (the default one needs torchvision)."""
    from transformers import DeepseekOcr2ImageProcessorPil, DeepseekOcr2Processor

    return DeepseekOcr2Processor.from_pretrained(model_dir, image_processor=DeepseekOcr2ImageProcessorPil.from_pretrained(model_dir))


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mmcore.data import ChatTemplateEncoder
    from mmcore.kits import ProcessorImages

    from mm_pack_deepseek_ocr2.tiny import CHAT_TEMPLATE

    data = ctx.config.data
    images = ProcessorImages(processor(model_dir), crop_to_patches=data.image_crop, min_patches=data.image_min_tiles, max_patches=data.image_max_tiles)
    return ChatTemplateEncoder(
        tokenizer,
        {"<image>": images},
        markers={"<image>": images.token},
        chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
        train_on_prompt=ctx.config.data.train_on_prompt,
        media_token_ids=[tokenizer.convert_tokens_to_ids(images.token)],
    )


def sam_patches(batch: dict[str, Any]) -> float:
    """Patches through the SAM tower (global views and tiles), counted in the released model's
    16-pixel patches: the tiny presets' 2-pixel ones make this a relative measure there."""
    views = [batch[name] for name in ("pixel_values", "pixel_values_local") if batch.get(name) is not None]
    return float(sum(v.shape[0] * (v.shape[-1] // 16) * (v.shape[-2] // 16) for v in views))


def tile_counts(batch: dict[str, Any], samples: list[dict[str, Any]], ids: Any) -> None:
    """``num_local_patches`` as integers (stored samples hold arrays as floats): the model splits
    the tiles' features by them."""
    if "num_local_patches" in batch:
        batch["num_local_patches"] = batch["num_local_patches"].long()


def prepare_model(ctx: StageContext, model: Any, upstream: Any) -> None:
    if "extract" in upstream:
        from mm_pack_deepseek_ocr2.extract import use_cached_vision

        use_cached_vision(model)


FAMILY = VLMFamily(
    model_class="DeepseekOcr2ForConditionalGeneration",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=("pixel_values", "pixel_values_local", "num_local_patches"),
    tokens={"image_token_id": "<image>"},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.vision_tower.sam_encoder.layers", "model.vision_tower.vision_encoder.layers", "model.language_model.layers"),
    collate_extra=tile_counts,
    prepare_model=prepare_model,
    towers={"model.vision_tower": sam_patches},
    demo=write_shape_questions,
    preference_demo=write_shape_preferences,
    lora_targets=LORA_TARGETS,
)
