"""Kimi-K2.5 as the VLM kit sees it: the model class, the state-dict adapter, the processor as the
image expander, the frozen-vision cache. The kit (:mod:`mmcore.kits.vlm`) does preprocessing,
collation, packing, loss, training and export.

The family: MoonViT (patches of 14 pixels, a learned 64 x 64 position grid resampled bicubically
to each image's grid, 2-D rotary attention within each image), whose 2 x 2 neighbouring patches
are merged into one token by the projector (LayerNorm, two linears); the decoder is DeepSeek-V3's
(multi-head latent attention, 1-D RoPE; a dense first layer, then 384 routed experts, top 8 by
sigmoid scores with a selection bias, beside one shared expert). Packed rows restart their
positions per sample and need nothing family-specific: the vision tower runs per image whatever
the packing. transformers' DeepSeek-V3 has no router load-balancing loss (no
``router_aux_loss_coef``: DeepSeek-V3 balances by the selection bias, without an auxiliary loss),
so none is added.

The processor (``Kimi_K25Processor``, on the pack's PIL image processor: no torchvision) expands
each ``<|media_pad|>``: the count of tokens is its own, so preprocessing asks it per image.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from pydantic import Field

from mmcore import Manifest, StageContext, StageResult
from mmcore.config import RunConfig
from mmcore.data import MLLMDataSection, write_shape_preferences, write_shape_questions
from mmcore.kits import VLMFamily

from mm_pack_kimi_k25.names import RULES, KimiK25Names


class KimiK25Config(RunConfig):
    data: MLLMDataSection = Field(default_factory=MLLMDataSection)


# the adapter without its vision head count: adapter_for(config) binds it (convert and export do)
ADAPTER = KimiK25Names(rules=RULES, per_expert=True)


def adapter_for(config_or_dir: Any) -> KimiK25Names:
    """The adapter for a model folder or config: the vision tower's head count bound."""
    if isinstance(config_or_dir, (str, Path)):
        config_or_dir = FAMILY.config(Path(config_or_dir))
    return dataclasses.replace(ADAPTER, vision_heads=config_or_dir.vision_config.num_attention_heads)


# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["model.vision_tower.*"],
    "projector": ["model.mm_projector.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}

# LoRA's default layers: the decoder's attention projections (MLA's low-rank ones too) and MLP
# projections (the dense layer's, the shared experts'); not the router (``mlp.gate``) nor the
# fused routed experts (3-D parameters).
LORA_TARGETS = (
    "model.language_model.layers.*.self_attn.*_proj",
    "model.language_model.layers.*.self_attn.kv_a_proj_with_mqa",
    "model.language_model.layers.*.mlp.*_proj",
    "model.language_model.layers.*.mlp.shared_experts.*_proj",
)


def processor(model_dir: Path) -> Any:
    """The family's processor on the pack's PIL image processor (the library's needs torchvision)."""
    from transformers import AutoTokenizer

    from mm_pack_kimi_k25.image_processor import KimiK25ImageProcessorPil, KimiK25ImagesProcessor

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return KimiK25ImagesProcessor(image_processor=KimiK25ImageProcessorPil.from_pretrained(model_dir), tokenizer=tokenizer, chat_template=tokenizer.chat_template)


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mmcore.data import ChatTemplateEncoder
    from mmcore.kits import ProcessorImages

    from mm_pack_kimi_k25.tiny import CHAT_TEMPLATE

    images = ProcessorImages(processor(model_dir))
    return ChatTemplateEncoder(
        tokenizer,
        {"<image>": images},
        markers={"<image>": images.token},
        chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
        train_on_prompt=ctx.config.data.train_on_prompt,
        media_token_ids=[tokenizer.convert_tokens_to_ids(images.token)],
    )


def vision_patches(batch: dict[str, Any]) -> float:
    return float(batch["pixel_values"].shape[0]) if batch.get("pixel_values") is not None else 0.0


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if "extract" in upstream:
        from mm_pack_kimi_k25.extract import use_cached_vision

        use_cached_vision(model)


def side_files(model_dir: Path, out: Path) -> None:
    """The folder's non-weight files, its config naming transformers' class: the released
    config.json names Moonshot's remote-code class (``KimiK25ForConditionalGeneration`` and an
    ``auto_map``), whose module an export does not carry; the weights are in the layout both read."""
    import json

    from mmcore.engines import copy_side_files

    copy_side_files(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["Kimi_K25ForConditionalGeneration"]
    config.pop("auto_map", None)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


class KimiK25Family(VLMFamily):
    """The kit's family, its adapter bound to the model folder's vision head count on export."""

    def export(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        bound = dataclasses.replace(self, adapter=adapter_for(upstream["download"].output("model")))
        return VLMFamily.export(bound, ctx, upstream)


def convert(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    """The engine's convert stage with the adapter bound to the downloaded config."""
    from mmcore.engines import convert_stage

    return convert_stage(ctx, upstream, adapter=adapter_for(upstream["download"].output("model")), build_model=FAMILY.build_model)


FAMILY = KimiK25Family(
    model_class="Kimi_K25ForConditionalGeneration",
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=("pixel_values", "image_grid_thw"),
    tokens={"image_token_id": "<|media_pad|>"},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.vision_tower.layers", "model.language_model.layers"),
    prepare_model=prepare_model,
    towers={"model.vision_tower": vision_patches},
    demo=write_shape_questions,
    preference_demo=write_shape_preferences,
    lora_targets=LORA_TARGETS,
    end_token="<|im_end|>",
    side_files=side_files,
)
