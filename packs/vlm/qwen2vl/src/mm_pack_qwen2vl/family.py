"""Qwen2-VL and Qwen2.5-VL as the VLM kit sees them: model classes, media fields, M-RoPE
positions for packed rows, the fused RMSNorm, the frozen-vision cache. The kit
(:mod:`mmcore.kits.vlm`) does preprocessing, collation, loss, training and export.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.hub import remote_code
from mmcore.data.synthetic import write_shape_preferences, write_shape_questions
from mmcore.kits.vlm import VLMFamily, rows_of
from mmcore.rundir import Manifest
from mm_qwen_vision import packed_mrope_positions

from mm_pack_qwen2vl.adapter import ADAPTER

MEDIA_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
PACKED_COUNTS = {"segment_images": "image_grid_thw", "segment_videos": "video_grid_thw"}

# training.freeze accepts these names as well as parameter globs.
FREEZE_GROUPS = {
    "vision": ["model.visual.patch_embed.*", "model.visual.blocks.*"],
    "projector": ["model.visual.merger.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}


def model_class(config: Any) -> Any:
    import transformers

    return transformers.Qwen2_5_VLForConditionalGeneration if config.model_type == "qwen2_5_vl" else transformers.Qwen2VLForConditionalGeneration


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from transformers import AutoConfig

    from mm_pack_qwen2vl.data import Encoder

    return Encoder(tokenizer, ctx.config.data, merge_size=AutoConfig.from_pretrained(model_dir, **remote_code()).vision_config.spatial_merge_size)


def token_types(batch: dict[str, Any], samples: list[dict[str, Any]], ids: dict[str, int]) -> None:
    """``mm_token_type_ids`` (0 text, 1 image, 2 video): where M-RoPE places media."""
    tokens = batch["input_ids"]
    batch["mm_token_type_ids"] = (tokens == ids["image_token_id"]).long() + 2 * (tokens == ids["video_token_id"]).long()


def packed_positions(model: Any, batch: dict[str, Any]) -> Any:
    def rope_index(tokens: slice, rows: dict[str, Any]) -> Any:
        pos, _ = model.model.get_rope_index(batch["input_ids"][:, tokens], batch["mm_token_type_ids"][:, tokens],
                                            image_grid_thw=rows["image_grid_thw"], video_grid_thw=rows["video_grid_thw"])
        return pos

    return packed_mrope_positions(batch, PACKED_COUNTS, rope_index)


def apply_kernels(model: Any, registry: Any, device: str) -> list[str]:
    """Route the model's RMSNorms and the text attention's rotary embedding through this
    device's fused kernels, where it has them.

    Returns the names changed (none where the reference is what runs: the transformers
    implementation is then used as is, and the parity tests hold them equal). The rotary
    function is swapped in the transformers modeling module (its attention looks it up there
    at each call, with no per-model hook), so it holds for every model of that module in this
    process, which all run on this device.
    """
    changed = []
    norm = registry.kernel_spec("qwen2vl.rms_norm", device)
    if norm.device != "reference":
        kernel = norm.load()
        for name, module in model.named_modules():
            if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
                module.forward = functools.partial(lambda m, x: kernel(x, m.weight, m.variance_epsilon), module)
                changed.append(name)
    rotary = registry.kernel_spec("qwen2vl.rotary", device)
    if rotary.device != "reference":
        rotate = rotary.load()

        def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> tuple[Any, Any]:
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            return rotate(q, cos, sin), rotate(k, cos, sin)

        modeling = {sys.modules[type(m).__module__] for m in model.modules() if type(m).__name__.endswith("Attention")}
        for module in sorted((m for m in modeling if hasattr(m, "apply_rotary_pos_emb")), key=lambda m: m.__name__):
            module.apply_rotary_pos_emb = apply_rotary_pos_emb
            changed.append(f"{module.__name__}.apply_rotary_pos_emb")
    return changed


def use_cached_vision(model: Any) -> Any:
    """Make the vision tower take cached block outputs and apply only the merger (projector)."""
    from mm_qwen_vision import use_cached_vision as merger_only

    merger_only(model.model.visual)
    return model


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    if ctx.plugins is not None:
        apply_kernels(model, ctx.plugins.registry, ctx.accelerator.name)
    if "extract" in upstream:
        use_cached_vision(model)


FAMILY = VLMFamily(
    model_class=model_class,
    encoder=encoder,
    adapter=ADAPTER,
    media_fields=MEDIA_FIELDS,
    tokens={"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"},
    freeze_groups=FREEZE_GROUPS,
    shard_layers=("model.visual.blocks", "model.language_model.layers"),
    model_inputs=("mm_token_type_ids",),
    packed_counts=PACKED_COUNTS,
    packed_positions=packed_positions,
    collate_extra=token_types,
    prepare_model=prepare_model,
    towers={"model.visual": rows_of("pixel_values", "pixel_values_videos")},
    demo=write_shape_questions,
    preference_demo=write_shape_preferences,
    end_token="<|im_end|>",
)
