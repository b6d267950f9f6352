"""Qwen2-VL and Qwen2.5-VL as the VLM kit sees them: model classes, media fields, M-RoPE
positions for packed rows, the fused RMSNorm, the frozen-vision cache, and the megatron-core
side (:class:`Qwen2VLFamily`). The kit (:mod:`mmcore.kits.vlm`) does preprocessing, collation,
loss, training and export.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mmcore import StageContext
from mmcore.engines import remote_code
from mmcore.kits import VLMFamily
from mmcore import Manifest
from mm_qwen_vision.family import qwen_vision_fields

from mm_pack_qwen2vl.adapter import ADAPTER
from mm_pack_qwen2vl.megatron import megatron_family, of_checkpoint

if TYPE_CHECKING:
    from mmcore.backends.megatron import MegatronFamily, ParallelMap

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


def apply_kernels(model: Any, registry: Any, device: str) -> list[str]:
    """The ``qwen2vl.*`` kernels of ``device`` wired into ``model`` (:func:`mm_qwen_vision.kernels.apply_kernels`)."""
    from mm_qwen_vision.kernels import apply_kernels as wire

    return wire(model, registry, device, "qwen2vl")


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


class Qwen2VLFamily(VLMFamily):
    """The kit's family with its megatron-core side (the protocols of :mod:`mmcore.backends.megatron.family`)."""

    def megatron_part(self, model_dir: Path) -> "MegatronFamily":
        """``parallel.backend: megatron`` (``MegatronPart``): the language model as a megatron-core ``GPTModel``."""
        return megatron_family(model_dir)

    def megatron_table(self, model_dir: Path) -> "ParallelMap":
        """``export.format: mindspeed-mm`` (``MegatronTable``): the Megatron table of the checkpoint."""
        return of_checkpoint(model_dir)


FAMILY = Qwen2VLFamily(
    **qwen_vision_fields(
        model_class=model_class,
        encoder=encoder,
        adapter=ADAPTER,
        freeze_groups=FREEZE_GROUPS,
        prepare_model=prepare_model,
    )
)
