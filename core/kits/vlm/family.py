"""The VLM kit's declaration: :class:`VLMFamily`, what a pack says once of its transformers
conversational model family, and how the kit builds and reloads that model.

The family's other methods come from the kit's modules, one job each: :mod:`.batches`
(collation, forward, loss, FLOPs), :mod:`.stages` (preprocess, export), :mod:`.generation`
(infer, evaluate); :meth:`VLMFamily.recipe` hands the train engine a
:class:`~mmcore.kits.vlm.recipe.VLMRecipe` (:mod:`.recipe`) or its DPO one (:mod:`.dpo`).

A family that also runs on megatron-core says so through the megatron backend's protocols
(:mod:`mmcore.backends.megatron.family`): ``megatron_part(model_dir)`` (:class:`~mmcore.backends.megatron.family.MegatronPart`,
``parallel.backend: megatron``) and ``megatron_table(model_dir)``
(:class:`~mmcore.backends.megatron.family.MegatronTable`, ``export.format: mindspeed-mm``), methods of a
subclass (``packs/vlm/qwen2vl``: ``Qwen2VLFamily``). The SDK 1.x fields ``megatron`` and
``parallel_map`` still work, deprecated until SDK 2.0.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.framework.context import StageContext
from mmcore.engines.download import remote_code
from mmcore.kits.vlm.batches import Batch, CollateExtra, VLMBatches
from mmcore.kits.vlm.generation import VLMGeneration
from mmcore.kits.vlm.stages import VLMStages
from mmcore.backends.megatron.family import MegatronPart, MegatronTable
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.backends.megatron.family import MegatronFamily
    from mmcore.backends.megatron.tensor_map import ParallelMap
    from mmcore.train import TrainRecipe

#: ``(ctx, model dir, tokenizer) -> encoder`` (``encode``/``truncate``, see ChatTemplateEncoder)
EncoderFactory = Callable[[StageContext, Path, Any], Any]


@dataclass(frozen=True, eq=False)
class VLMFamily(VLMBatches, VLMStages, VLMGeneration):
    """One transformers conversational model family, as the VLM kit needs to know it.

    Attributes:
        model_class: the transformers class name (``"LlavaForConditionalGeneration"``), or
            ``config -> class`` where one family has several.
        encoder: ``(ctx, model dir, tokenizer) -> encoder`` for preprocess.
        adapter: the pack's state-dict adapter (hub names <-> model names), for export.
        media_fields: per-sample tensors the model takes, concatenated across a batch
            (``pixel_values``, ``image_grid_thw``, ...).
        tokens: dataset index key -> token, recorded by preprocess and handed to collation
            (``{"image_token_id": "<image>"}``); ``pad_id`` is always there.
        freeze_groups: ``training.freeze`` names -> parameter globs.
        shard_layers: dotted paths of the module lists whose items FSDP shards one by one
            (``"model.language_model.layers"``).
        config_class: transformers config class name, where ``AutoConfig`` is not the one
            (a thinker inside a larger checkpoint); exports then write that class's config
            alone (not the full folder's, whose other parts are not exported).
        model_inputs: batch keys given to ``forward`` besides ids, mask and ``media_fields``.
        packed_counts: batch key -> sample field whose rows each sample brings, for packing
            (``{"segment_images": "image_grid_thw"}``).
        packed_positions: ``(model, batch) -> position_ids`` of a packed row, where restarting
            1-D positions are not what the model takes.
        collate_extra: adds the family's own batch fields (token type ids, padded audio).
        prepare_model: ``(ctx, model, upstream) -> None`` before training: kernels, and where
            ``"extract" in upstream`` the frozen towers switched to the cached features.
        cache_replaces: cached field -> the sample field it stands in for.
        demo: writes the pack's synthetic demo dataset (``data.demo_samples``).
        end_token: where ``generate()`` stops (default: the tokenizer's eos).
        side_files: ``(model dir, export dir) -> None`` for the non-weight files of the export
            (default: copy them).
        towers: module path -> ``batch -> tokens`` through it (vision patches, audio frames),
            for the FLOPs of a step (:mod:`mmcore.train.flops`); the rest of the model counts text tokens.
        frame_towers: module paths of vision towers called as ``(patch rows, grid_thw=[n, 3])``
            that attend only within each temporal patch (Qwen-style; ``spatial_merge_size``
            rows per output token): under ``parallel.ulysses`` a sequence group splits their
            frames instead of each rank running all of them (:mod:`mmcore.backends.ulysses_towers`).
        packed_attention: with ``training.packing``, the text decoder's attention runs through
            the device's ``varlen_attention`` kernel (:mod:`mmcore.train.attention`, no T x T mask);
            False for a family whose text mask is not causal.
        lora_targets: the default of ``training.lora.target_modules`` (groups or module
            globs) among the linear layers of ``shard_layers``: the language model's.
        preference_demo: writes the pack's synthetic preference pairs (``data.demo_samples``
            with ``data.ranking``), for its DPO demo.
        router_aux_loss: where the model is a mixture of experts (its text config has
            ``router_aux_loss_coef``), SFT asks its forward for the router's load-balancing loss
            (``output_router_logits``, transformers' ``aux_loss``) and adds ``coef x aux_loss``
            per loss token of the micro-batch (``training.moe_aux_loss_coef``, by default the
            config's): after the engine divides by the step's loss tokens it weighs as in
            transformers' own loss. Like transformers' and Megatron's, the loss is computed per
            micro-batch, so it depends on how samples are cut into micro-batches. False leaves it out.
        error_rates: evaluate also scores each answer as a transcript: word and character
            errors per item and the corpus ``wer`` and ``cer`` (a speech recognition family).
        batch_apart: sample fields (``pixel_values_videos``) whose presence keeps samples in
            their own micro-batches and generation batches: for a model that cannot take the
            kinds in one forward (GLM-4V writes images and video frames with one token).
        parallel_map: deprecated (SDK 1.x, until SDK 2.0): ``model folder -> ParallelMap``;
            implement :class:`~mmcore.backends.megatron.family.MegatronTable` (``megatron_table``) instead.
        megatron: deprecated (SDK 1.x, until SDK 2.0): ``model folder -> MegatronFamily``;
            implement :class:`~mmcore.backends.megatron.family.MegatronPart` (``megatron_part``) instead.
    """

    model_class: str | Callable[[Any], Any]
    encoder: EncoderFactory
    adapter: Any
    media_fields: Sequence[str] = ("pixel_values",)
    tokens: Mapping[str, str] = field(default_factory=dict)
    freeze_groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    shard_layers: Sequence[str] = ()
    config_class: str | None = None
    model_inputs: Sequence[str] = ()
    packed_counts: Mapping[str, str] = field(default_factory=dict)
    packed_positions: Callable[[Any, Batch], Any] | None = None
    collate_extra: CollateExtra | None = None
    prepare_model: Callable[[StageContext, Any, Mapping[str, Manifest]], None] | None = None
    cache_replaces: Mapping[str, str] = field(default_factory=dict)
    demo: Any = None
    end_token: str | None = None
    side_files: Callable[[Path, Path], None] | None = None
    towers: Mapping[str, Callable[[Batch], float]] = field(default_factory=dict)
    frame_towers: Sequence[str] = ()
    packed_attention: bool = True
    lora_targets: Sequence[str] = ("model.language_model.*",)
    preference_demo: Any = None
    router_aux_loss: bool = True
    batch_apart: Sequence[str] = ()
    error_rates: bool = False
    parallel_map: Callable[[Path], Any] | None = None  # deprecated: MegatronTable
    megatron: Callable[[Path], Any] | None = None  # deprecated: MegatronPart

    def __post_init__(self) -> None:
        for name, instead in (("megatron", "MegatronPart (a megatron_part method)"), ("parallel_map", "MegatronTable (a megatron_table method)")):
            if getattr(self, name) is not None:
                warnings.warn(
                    f"VLMFamily({name}=...) is deprecated and goes in SDK 2.0: implement mmcore.backends.megatron.family.{instead} in a subclass of VLMFamily", DeprecationWarning, stacklevel=3
                )

    # -- the model ---------------------------------------------------------------------------

    def config(self, model_dir: Path) -> Any:
        import transformers

        config_class = getattr(transformers, self.config_class) if self.config_class else transformers.AutoConfig
        return config_class.from_pretrained(model_dir, **remote_code())

    def model_type(self, config: Any) -> Any:
        import transformers

        return getattr(transformers, self.model_class) if isinstance(self.model_class, str) else self.model_class(config)

    def build_model(self, model_dir: Path, checkpoint: Path | None = None) -> Any:
        """The model of ``model_dir``'s config, weights from a DCP ``checkpoint`` (convert's or train's)."""
        from mmcore.checkpoint.training import load_converted

        config = self.config(model_dir)
        config._attn_implementation = "sdpa"
        model = self.model_type(config)(config)
        if checkpoint is not None:
            load_converted(model, checkpoint)
        return model

    def export_side_files(self, model_dir: Path, out: Path) -> None:
        """The export's non-weight files: ``side_files``, or the folder's copied with, under
        ``config_class``, the config of the part the model is."""
        from mmcore.engines.convert import copy_side_files

        if self.side_files is not None:
            self.side_files(model_dir, out)
            return
        copy_side_files(model_dir, out)
        if self.config_class:
            self.config(model_dir).save_pretrained(out)

    def load_exported(self, folder: Path) -> Any:
        """An exported model folder, or a LoRA adapter folder on its base (peft's layers, unmerged)."""
        from mmcore.train.lora import with_adapters

        return with_adapters(lambda path: self.model_type(self.config(path)).from_pretrained(path, attn_implementation="sdpa"))(folder)

    # -- training ----------------------------------------------------------------------------

    def recipe(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> "TrainRecipe":
        """The train engine's recipe for ``training.method``: SFT (:meth:`sft_recipe`), DPO on
        preference pairs (:class:`~mmcore.kits.vlm.dpo.VLMDPORecipe`) or GRPO on prompts with
        references (:class:`~mmcore.kits.vlm.grpo.VLMGRPORecipe`)."""
        if ctx.config.training.method == "grpo":
            from mmcore.kits.vlm.grpo import VLMGRPORecipe

            return VLMGRPORecipe(self, ctx, upstream)
        if ctx.config.training.method == "dpo":
            from mmcore.kits.vlm.dpo import VLMDPORecipe

            return VLMDPORecipe(self, ctx, upstream)
        return self.sft_recipe(ctx, upstream)

    def sft_recipe(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> "TrainRecipe":
        """The SFT recipe: :class:`~mmcore.kits.vlm.recipe.VLMRecipe`, or where the family runs
        on megatron-core :class:`~mmcore.kits.vlm.recipe.VLMMegatronRecipe` (also
        ``parallel.backend: megatron``'s)."""
        from mmcore.kits.vlm.recipe import VLMMegatronRecipe, VLMRecipe

        part = megatron_part_of(self)
        return VLMMegatronRecipe(self, ctx, upstream, part) if part is not None else VLMRecipe(self, ctx, upstream)


def megatron_part_of(family: VLMFamily) -> "Callable[[Path], MegatronFamily] | None":
    """``model folder -> MegatronFamily`` where ``family`` runs on megatron-core: its
    :class:`~mmcore.backends.megatron.family.MegatronPart` method, or the deprecated ``megatron`` field."""
    return family.megatron_part if isinstance(family, MegatronPart) else family.megatron


def megatron_table_of(family: VLMFamily) -> "Callable[[Path], ParallelMap] | None":
    """``model folder -> ParallelMap`` where ``family`` has a Megatron table: its
    :class:`~mmcore.backends.megatron.family.MegatronTable` method, or the deprecated ``parallel_map`` field."""
    return family.megatron_table if isinstance(family, MegatronTable) else family.parallel_map


__all__ = ["VLMFamily", "EncoderFactory", "megatron_part_of", "megatron_table_of"]
