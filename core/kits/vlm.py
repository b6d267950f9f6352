"""The VLM kit: the stages of a transformers conversational model, from one declaration.

A pack describes its family once, as a :class:`VLMFamily` (the model class, how media reaches
the model, the token ids collation needs, what to shard and freeze); the family's methods are
the stage functions and parts its declared stages bind::

    FAMILY = VLMFamily(model_class="LlavaForConditionalGeneration", encoder=make_encoder, ...)

    STAGES = {
        "download": Stage("mmcore.hub:download_stage", parts={"build_init": "mm_pack_x.tiny:build_init_checkpoint"}),
        "convert": Stage("mmcore.convert:convert_stage", parts={"adapter": "mm_pack_x.adapter:ADAPTER",
                                                               "build_model": "mm_pack_x.family:FAMILY.build_model"}),
        "preprocess": "mm_pack_x.family:FAMILY.preprocess",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_x.family:FAMILY.recipe"}),
        "export": "mm_pack_x.family:FAMILY.export",
        "evaluate": "mm_pack_x.family:FAMILY.evaluate",
        "infer": "mm_pack_x.family:FAMILY.infer",
    }

What the kit does with it:

* **preprocess**: MLLM JSON through the pack's encoder (a
  :class:`~mmcore.data.chat_template.ChatTemplateEncoder`), the ids of ``tokens`` recorded in
  the dataset index.
* **collate**: right-padded rows, or with ``training.packing`` one row of samples back to back
  (``segments``) with restarting positions (``packed_positions`` where the family's positions
  are not 1-D, e.g. M-RoPE); every ``media_fields`` tensor concatenated in sample order.
* **train**: summed next-token loss, FSDP units from ``shard_layers``, ``freeze_groups`` for
  ``training.freeze``, exact-match accuracy on the held-out split; with a finished extract
  stage the samples read its feature cache (``cache_replaces``) and ``prepare_model`` switches
  the frozen towers to cached inputs.
* **export**: the trained checkpoint as a ``from_pretrained`` folder, reloaded by the model
  class and compared logit for logit.
* **evaluate**: the export's greedy answers to the held-out prompts (batched, left-padded,
  KV cache), scored by exact match and token F1; per-item results and a report.
* **infer**: ``mmcore infer`` requests encoded as training encoded them, then generated.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mmcore.causal_lm import count_loss_tokens, evaluate_accuracy, next_token_loss_sum, packed_rows, padded_rows
from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.generation import PLACEHOLDERS, ModelSource, Request, empty_evaluation, generation_dtype
from mmcore.hub import remote_code
from mmcore.kits import blocks_at
from mmcore.pack import StageResult
from mmcore.rundir import Manifest

Batch = dict[str, Any]
#: ``(ctx, model dir, tokenizer) -> encoder`` (``encode``/``truncate``, see ChatTemplateEncoder)
EncoderFactory = Callable[[StageContext, Path, Any], Any]
#: ``(batch, samples, ids) -> None``: the family's own fields, added to a collated batch in place
CollateExtra = Callable[[Batch, list[dict[str, Any]], Mapping[str, int]], None]


@dataclass(frozen=True, eq=False)
class VLMFamily:
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
            for the FLOPs of a step (:mod:`mmcore.flops`); the rest of the model counts text tokens.
        packed_attention: with ``training.packing``, the text decoder's attention runs through
            the device's ``varlen_attention`` kernel (:mod:`mmcore.attention`, no T x T mask);
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
        batch_apart: sample fields (``pixel_values_videos``) whose presence keeps samples in
            their own micro-batches and generation batches: for a model that cannot take the
            kinds in one forward (GLM-4V writes images and video frames with one token).
        parallel_map: ``model folder -> ParallelMap``, the family's Megatron table
            (:mod:`mmcore.parallel_map`): with it, ``export.format: mindspeed-mm`` also writes
            MindSpeed-MM's layout (the pack's config uses ``MegatronExportSection``).
        megatron: ``model folder -> MegatronFamily`` (:mod:`mmcore.megatron.engine`): the family
            on megatron-core, so SFT runs on ``parallel.backend: megatron`` (tensor and pipeline
            parallelism).
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
    packed_attention: bool = True
    lora_targets: Sequence[str] = ("model.language_model.*",)
    preference_demo: Any = None
    router_aux_loss: bool = True
    batch_apart: Sequence[str] = ()
    parallel_map: Callable[[Path], Any] | None = None
    megatron: Callable[[Path], Any] | None = None

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
        from mmcore.checkpointing import load_converted

        config = self.config(model_dir)
        config._attn_implementation = "sdpa"
        model = self.model_type(config)(config)
        if checkpoint is not None:
            load_converted(model, checkpoint)
        return model

    def export_side_files(self, model_dir: Path, out: Path) -> None:
        """The export's non-weight files: ``side_files``, or the folder's copied with, under
        ``config_class``, the config of the part the model is."""
        from mmcore.convert import copy_side_files

        if self.side_files is not None:
            self.side_files(model_dir, out)
            return
        copy_side_files(model_dir, out)
        if self.config_class:
            self.config(model_dir).save_pretrained(out)

    def load_exported(self, folder: Path) -> Any:
        """An exported model folder, or a LoRA adapter folder on its base (peft's layers, unmerged)."""
        from mmcore.lora import with_adapters

        return with_adapters(lambda path: self.model_type(self.config(path)).from_pretrained(path, attn_implementation="sdpa"))(folder)

    # -- batches -----------------------------------------------------------------------------

    def collate(self, samples: list[dict[str, Any]], ids: Mapping[str, int], pack: bool = False) -> Batch:
        """Token rows plus every media field concatenated in sample order (as processors do).

        Rows are right-padded, or with ``pack`` one row without padding whose ``segments``
        keep the samples' lengths. The first token of every sample is never supervised: no
        loss crosses samples.
        """
        batch = packed_rows(samples, dict(self.packed_counts)) if pack else padded_rows(samples, ids["pad_id"])
        self.add_media(batch, samples, ids)
        batch["num_loss_tokens"] = count_loss_tokens(batch["labels"])
        return batch

    def add_media(self, batch: Batch, samples: list[dict[str, Any]], ids: Mapping[str, int]) -> None:
        """Every media field of ``samples`` concatenated in sample order (as processors do), then
        the family's own fields (``collate_extra``), into ``batch``."""
        import torch

        for name in self.media_fields:
            parts = [s[name] for s in samples if name in s]
            if parts:
                batch[name] = torch.cat(parts)
        if self.collate_extra is not None:
            self.collate_extra(batch, samples, ids)

    def forward(self, model: Any, batch: Batch, **options: Any) -> Any:
        """The model's output on a collated batch (packed rows get their positions)."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", *self.model_inputs, *self.media_fields) if k in batch}
        if "segments" in batch:
            inputs["position_ids"] = (self.packed_positions or restarting_positions)(model, batch)
        return model(**inputs, use_cache=False, **options)

    def forward_logits(self, model: Any, batch: Batch) -> Any:
        return self.forward(model, batch).logits

    def loss_sum(self, model: Any, batch: Batch, aux_coef: float | None = None) -> Any:
        """Summed next-token loss, plus the router's load-balancing loss of a mixture of experts
        (``aux_coef``, default its config's ``router_aux_loss_coef``; see ``router_aux_loss``)."""
        coef = getattr(model.config.get_text_config(), "router_aux_loss_coef", None) if self.router_aux_loss else None
        coef = coef if aux_coef is None or coef is None else aux_coef
        if not coef:
            return next_token_loss_sum(self.forward_logits(model, batch), batch["labels"])
        out = self.forward(model, batch, output_router_logits=True)
        aux = out.aux_loss if not batch.get("filler_tokens") else balance_loss_without_fillers(model, out, batch)
        return next_token_loss_sum(out.logits, batch["labels"]) + coef * aux * batch["num_loss_tokens"]

    def shard_modules(self, model: Any) -> list[Any]:
        return blocks_at(model, self.shard_layers)

    def step_flops(self) -> Callable[[Any, Batch], float]:
        """``(model, batch) -> FLOPs`` of a forward and backward: towers on their tokens, the
        rest on the text tokens, the decoder's attention per sample."""
        from mmcore.flops import StepFlops, attention_flops, dense_flops

        seen = StepFlops()

        def flops(model: Any, batch: Batch) -> float:
            trained, frozen = seen.counts("", model)
            total = 0.0
            for path, tokens in self.towers.items():
                tower = seen.counts(path, model.get_submodule(path))
                trained, frozen = trained - tower[0], frozen - tower[1]
                total += dense_flops(tower, tokens(batch))
            lengths = batch["segments"] if "segments" in batch else batch["attention_mask"].sum(1)
            text = model.config.get_text_config()
            width = text.num_attention_heads * (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
            total += dense_flops((trained, frozen), float(lengths.sum()))
            return total + attention_flops(text.num_hidden_layers, width, lengths.tolist())

        return flops

    # -- stages ------------------------------------------------------------------------------

    def preprocess(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        from transformers import AutoTokenizer

        from mmcore.data.conversations import preprocess_conversations

        model_dir = upstream["download"].output("model")
        tokenizer = AutoTokenizer.from_pretrained(model_dir, **remote_code())
        demo = self.preference_demo if getattr(ctx.config.data, "ranking", False) else self.demo
        ids = self.token_ids_of(tokenizer)
        return preprocess_conversations(ctx, self.encoder(ctx, model_dir, tokenizer), demo=demo, tokenizer=str(model_dir),
                                        tower_tokens=lambda tensors: self.tower_tokens(tensors, ids), **ids)

    def tower_tokens(self, sample: dict[str, Any], ids: Mapping[str, int]) -> float:
        """Tokens through the towers (``towers``) of one stored sample (a pair: its chosen answer's)."""
        import torch

        from mmcore.kits.vlm_dpo import chosen_view

        view = chosen_view(sample)
        batch: Batch = {"input_ids": view["input_ids"][None], "attention_mask": torch.ones_like(view["input_ids"])[None]}
        self.add_media(batch, [view], ids)
        return float(sum(tokens(batch) for tokens in self.towers.values()))

    def token_ids_of(self, tokenizer: Any) -> dict[str, int]:
        """``pad_id`` and the ids of ``tokens``, from the tokenizer (what preprocess records)."""
        return {"pad_id": tokenizer.pad_token_id, **{key: tokenizer.convert_tokens_to_ids(token) for key, token in self.tokens.items()}}

    def token_ids(self, data: Any) -> dict[str, int]:
        """The ids preprocess recorded in the dataset index (``pad_id`` and ``tokens``)."""
        return {key: int(data.index[key]) for key in ("pad_id", *self.tokens)}

    def recipe(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        """The train engine's recipe for ``training.method``: SFT (:meth:`sft_recipe`) or DPO on
        preference pairs (:func:`mmcore.kits.vlm_dpo.dpo_recipe`)."""
        if ctx.config.training.method == "dpo":
            from mmcore.kits.vlm_dpo import dpo_recipe

            return dpo_recipe(self, ctx, upstream)
        return self.sft_recipe(ctx, upstream)

    def sft_recipe(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        """The train engine's recipe; with a finished extract stage, samples read its feature cache."""
        from mmcore.data.shards import ShardDataset
        from mmcore.train import TrainRecipe

        dataset_dir = upstream["preprocess"].output("dataset")
        if ShardDataset(dataset_dir).index.get("ranking") and ctx.config.training.method != "dpo":
            raise StageError("the dataset holds preference pairs (data.ranking): train them with training.method: dpo")
        ids = self.token_ids(ShardDataset(dataset_dir))
        packing = ctx.config.training.packing
        cached = "extract" in upstream

        def load(split: str) -> Any:
            data = ShardDataset(dataset_dir).split(split)
            if cached:
                from mmcore.data.feature_cache import CachedSamples

                return CachedSamples(data, upstream["extract"].output("features"), replaces=dict(self.cache_replaces))
            return data

        train = load("train")

        def build(ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:  # weights: the engine loads them
            model = self.build_model(upstream["download"].output("model"))
            if self.prepare_model is not None:
                self.prepare_model(ctx, model, upstream)
            if packing and self.packed_attention:
                from mmcore.attention import use_packed_attention, varlen_attention

                use_packed_attention(model, ctx.kernel("varlen_attention") if ctx.plugins is not None else varlen_attention)
            return model

        fill = self.fill(dataset_dir, upstream, train.meta, lambda samples, tail: self.collate(with_tail(samples, tail), ids, pack=packing))

        @functools.cache
        def held() -> tuple[Any, Any]:  # the held-out split and its fill, read when first evaluated
            data = load("eval")
            return data, self.fill(dataset_dir, upstream, data.meta, lambda samples, tail: self.collate(with_tail(samples, tail), ids))

        return TrainRecipe(
            build_model=build,
            fill=fill,
            work_of=lambda i: float(train.meta(i).get("tower_tokens", 0)),
            weights=lambda ctx, upstream: upstream["convert"].output("checkpoint"),
            megatron=(lambda ctx, upstream: dataclasses.replace(self.megatron(upstream["download"].output("model")),  # type: ignore[misc]
                                                                held_out=load("eval"), collate_one=lambda s: self.collate([s], ids))) if self.megatron else None,
            flops=self.step_flops(),
            dataset=lambda ctx, upstream: train,
            length_of=train.length,
            collate=lambda samples: self.collate(samples, ids, pack=packing),
            loss=lambda model, batch: self.loss_sum(model, batch, ctx.config.training.moe_aux_loss_coef),
            shard_modules=self.shard_modules,
            freeze_groups=self.freeze_groups,
            lora_targets=self.lora_targets,
            group_of=self.group_of(train) if self.batch_apart else None,
            evaluate=lambda ctx, model, step: self.held_out_accuracy(ctx, model, held, ids),
        )

    def held_out_accuracy(self, ctx: StageContext, model: Any, held: Callable[[], tuple[Any, Any]], ids: Mapping[str, int]) -> dict[str, float]:
        """Exact-match accuracy on the held-out split (``held``: its samples and their fill),
        one sample per forward, the work split across ranks."""
        data, fill = held()
        return evaluate_accuracy(ctx, model, data, lambda s: self.collate([s], ids), self.forward_logits, fill=fill)

    def fill(self, dataset_dir: Path, upstream: Mapping[str, Manifest], meta: Callable[[int], Mapping[str, Any]],
             collate: Callable[[list[dict[str, Any]], list[dict[str, Any]]], Batch]) -> Any:
        """The recipe's :class:`~mmcore.data.fillers.Fill` over the samples ``meta`` describes:
        the dataset's filler samples (read through the feature cache where samples are), handed
        to ``collate(samples, fillers)``, which appends them to the tail of the micro-batch's last
        row (:func:`with_tail`)."""
        from mmcore.data.fillers import Fill, kinds_by_fields
        from mmcore.data.shards import ShardDataset

        records = ShardDataset(dataset_dir).fillers()
        if not len(records):  # preprocessed before fillers existed: mixed media across ranks cannot be evened
            def refuse(samples: list[dict[str, Any]], wanted: Sequence[str]) -> Batch:
                raise StageError(f"{dataset_dir}: this dataset mixes samples with and without media across processes, and was preprocessed "
                                 "by an mmcore without filler samples: rerun preprocess (mmcore preprocess --force ...)")

            return Fill(("media",), lambda i: {"media"} if meta(i).get("media") else set(), refuse)
        view: Any = records
        if "extract" in upstream:
            from mmcore.data.feature_cache import CachedSamples

            view = CachedSamples(records, upstream["extract"].output("features"), replaces=dict(self.cache_replaces))
        kinds = tuple(records.meta(i)["filler"] for i in range(len(records)))
        fillers: dict[str, dict[str, Any]] = {}

        def filled(samples: list[dict[str, Any]], wanted: Sequence[str]) -> Batch:
            if not fillers:
                fillers.update({kind: view[i] for i, kind in enumerate(kinds)})  # read once, when first wanted
            chosen = [fillers[k] for k in wanted]
            batch = collate(samples, chosen)
            batch["filler_tokens"] = sum(len(f["input_ids"]) for f in chosen)  # the last sample's tail (see loss_sum)
            return batch

        fields = {kind: records.meta(i)["media"] for i, kind in enumerate(kinds)}
        return Fill(kinds, kinds_by_fields(fields, lambda i: meta(i).get("media", ())), filled)

    def group_of(self, data: Any) -> Callable[[int], tuple[bool, ...]]:
        """``sample index -> which of batch_apart's fields it has`` (from the dataset index,
        where preprocess recorded the sample's media fields; else from the sample)."""
        def key(i: int) -> tuple[bool, ...]:
            if not self.batch_apart:
                return ()
            media = data.meta(i).get("media")
            present = set(media) if media is not None else set(data[i])
            return tuple(name in present for name in self.batch_apart)

        return key

    def export(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Write the export and prove it reproduces the trained logits (the evaluate stage then
        answers the held-out prompts with it)."""
        from mmcore.data.shards import ShardDataset
        from mmcore.export import export_checked

        from mmcore.kits.vlm_dpo import chosen_view

        data = ShardDataset(upstream["preprocess"].output("dataset"))
        held_out = data.split("eval")
        probe = held_out if len(held_out) else data
        kind = self.group_of(probe)
        same_kind = list(itertools.islice((i for i in range(len(probe)) if kind(i) == kind(0)), 4))  # batch_apart: one kind per forward
        done = export_checked(
            ctx, upstream, self.adapter, build_trained=self.build_model, load_exported=self.load_exported,
            probe=self.collate([chosen_view(probe[i]) for i in same_kind], self.token_ids(data)), logits=self.forward_logits,
            side_files=self.export_side_files,
        )
        outputs, metrics, notes = dict(done.outputs), dict(done.metrics), list(done.notes)
        if getattr(ctx.config.export, "format", "hf") == "mindspeed-mm":
            from mmcore.mindspeed_mm import export_mindspeed

            if self.parallel_map is None:
                raise StageError(f"export.format=mindspeed-mm: the {ctx.pack} pack has no Megatron table")
            more_outputs, more_metrics, more_notes = export_mindspeed(ctx, ctx.stage_dir / done.outputs["model"], self.parallel_map)
            outputs.update(more_outputs)
            metrics.update(more_metrics)
            notes.extend(more_notes)
        return StageResult(outputs=outputs, metrics=metrics, notes=notes)

    # -- generation: infer and evaluate -------------------------------------------------------

    def generation_model(self, ctx: StageContext, upstream: Mapping[str, Manifest], source: ModelSource) -> tuple[Any, Path]:
        """(the model in eval mode on the run's device, the folder with its tokenizer and config)."""
        if source.kind == "train":
            folder = upstream["download"].output("model")
            model = self.build_model(folder, source.path)
        else:
            folder = source.path
            model = self.load_exported(folder)
        return model.eval().to(ctx.accelerator.device(), generation_dtype(ctx)), folder

    def generation_inputs(self, model: Any, prompts: list[dict[str, Any]], ids: Mapping[str, int]) -> Batch:
        """``generate()`` inputs of prompts (``input_ids`` and media fields): ids left-padded,
        media concatenated in order, the family's own fields added as collation adds them."""
        from mmcore.generation import left_padded

        input_ids, mask = left_padded([p["input_ids"].tolist() for p in prompts], ids["pad_id"])
        batch: Batch = {"input_ids": input_ids, "attention_mask": mask}
        self.add_media(batch, prompts, ids)
        weight = next(model.parameters())
        return {k: v.to(weight.device, weight.dtype if v.is_floating_point() else None) for k, v in batch.items()
                if k in ("input_ids", "attention_mask", *self.model_inputs, *self.media_fields)}

    def generate(self, ctx: StageContext, model: Any, folder: Path, prompts: list[dict[str, Any]], *, what: str) -> tuple[list[list[int]], Any, dict[str, int]]:
        """(generated tokens per prompt, the tokenizer, its token ids), batched as ``generation`` says."""
        from transformers import AutoTokenizer

        from mmcore.generation import generate_tokens, sampling_options

        tokenizer = AutoTokenizer.from_pretrained(folder, **remote_code())
        ids = self.token_ids_of(tokenizer)
        end = tokenizer.convert_tokens_to_ids(self.end_token) if self.end_token else tokenizer.eos_token_id
        cfg = ctx.config.generation
        kinds: dict[tuple[bool, ...], list[int]] = {}
        for i, prompt in enumerate(prompts):  # batch_apart: each kind generates in its own batches
            kinds.setdefault(tuple(name in prompt for name in self.batch_apart), []).append(i)
        tokens: list[list[int]] = [[] for _ in prompts]
        for members in kinds.values():
            generated = generate_tokens(
                model, [prompts[i] for i in members], lambda chosen: self.generation_inputs(model, chosen, ids), length=lambda p: len(p["input_ids"]),
                end_ids=sorted({end, tokenizer.eos_token_id} - {None}), pad_id=ids["pad_id"], max_new_tokens=cfg.max_new_tokens,
                batch_size=cfg.batch_size, options=sampling_options(cfg, ctx.seed),
                progress=lambda groups, total: ctx.progress(groups, total=total, description=what, unit="batch"),
            )
            for i, answer in zip(members, generated):
                tokens[i] = answer
        return tokens, tokenizer, ids

    def infer(self, ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
        """Answer each request: its turns encoded as training encoded them, up to the assistant's
        turn, then generated."""
        from transformers import AutoTokenizer

        from mmcore.data.media import MediaError
        from mmcore.data.mllm import Sample, Turn
        from mmcore.generation import context_length

        network, folder = self.generation_model(ctx, upstream, model)
        encoder = self.encoder(ctx, folder, AutoTokenizer.from_pretrained(folder, **remote_code()))
        limit = context_length(network.config)
        prompts: list[dict[str, Any]] = []
        answers: list[dict[str, Any]] = [{} for _ in requests]
        where: list[int] = []
        for i, request in enumerate(requests):
            turns = [Turn(role, text) for role, text in request.turns] or [Turn("user", "")]  # type: ignore[arg-type]
            if not any(p in "".join(t.content for t in turns) for p in PLACEHOLDERS.values()):
                turns[-1] = Turn("user", "".join(PLACEHOLDERS[k] * len(v) for k, v in request.media.items()) + turns[-1].content)
            try:
                encoded = encoder.encode_prompt(Sample(request.where, i, turns, dict(request.media)))
            except (MediaError, ValueError) as exc:
                answers[i] = {"error": " ".join(str(exc).split())}
                continue
            if limit is not None and len(encoded.input_ids) >= limit:  # the model would answer from positions it never learnt
                answers[i] = {"error": f"the prompt is {len(encoded.input_ids)} tokens, the model's context is {limit} (max_position_embeddings in its config.json): shorten it"}
                continue
            prompts.append({"input_ids": torch_tensor(encoded.input_ids), **encoded.tensors})
            where.append(i)
        if prompts:
            tokens, tokenizer, _ = self.generate(ctx, network, folder, prompts, what="infer")
            for i, generated in zip(where, tokens):
                answers[i] = {"text": tokenizer.decode(generated, skip_special_tokens=True).strip()}
        return answers

    def evaluate(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Greedy answers of the export to the held-out prompts, scored against the references:
        ``accuracy`` (normalised exact match), ``token_f1``, and ``token_accuracy`` (the answer's
        tokens reproduced exactly, what teacher-forced accuracy measures without teacher forcing)."""
        from mmcore.causal_lm import answer_span
        from mmcore.data.mllm import read_samples
        from mmcore.generation import ModelSource, answer_scores, write_results
        from mmcore.report import held_out_sources, keep_media, user_text

        items, skipped = self.held_out(ctx, upstream)
        if not items:
            return empty_evaluation(ctx, skipped)
        source = ModelSource("export", upstream["export"].output("model"))
        network, folder = self.generation_model(ctx, upstream, source)
        prompts, references = [], []
        for _, sample in items:
            start, answer = answer_span(sample)
            prompts.append({k: v for k, v in sample.items() if k != "labels"} | {"input_ids": sample["input_ids"][:start]})
            references.append(answer)
        tokens, tokenizer, _ = self.generate(ctx, network, folder, prompts, what="evaluate")
        ends = set(tokenizer.convert_tokens_to_ids([self.end_token]) if self.end_token else []) | {tokenizer.eos_token_id}
        sources, rows = held_out_sources(ctx, upstream, lambda path: read_samples(path, ctx.config.data)), []
        for (name, _), prompt, answer, generated in zip(items, prompts, references, tokens):
            while answer and answer[-1] in ends:
                answer = answer[:-1]
            reference = tokenizer.decode(answer, skip_special_tokens=True).strip()
            prediction = tokenizer.decode(generated, skip_special_tokens=True).strip()
            said = sources.get(name)  # the user's words and media as written, not the template the model read
            rows.append({"item": name, "prompt": user_text(said.turns) if said else tokenizer.decode(prompt["input_ids"], skip_special_tokens=True).strip()[-300:],
                         "media": keep_media(ctx.stage_dir, [f for files in said.media.values() for f in files]) if said else [],
                         "reference": reference, "prediction": prediction, **answer_scores(prediction, reference), "token_match": float(generated == answer)})
        n = len(rows)
        metrics = {"items": n, "skipped": skipped, "accuracy": sum(r["exact_match"] for r in rows) / n,
                   "token_f1": sum(r["token_f1"] for r in rows) / n, "token_accuracy": sum(r["token_match"] for r in rows) / n}
        write_results(ctx.stage_dir, rows, metrics, title=f"{ctx.pack}: greedy answers of the export {folder.name}/ to the held-out prompts",
                      columns=("item", "prompt", "reference", "prediction", "exact_match", "token_f1"), ctx=ctx)
        note = (f"{n} held-out item(s), greedy generate() on the export: accuracy {metrics['accuracy']:.1%} "
                f"(exact tokens {metrics['token_accuracy']:.1%}), token F1 {metrics['token_f1']:.3f}; report in {ctx.stage_dir / 'report.html'}")
        return StageResult(outputs={"results": "results.jsonl", "metrics": "metrics.json", "report": "report.html"}, metrics=metrics, notes=[note])

    def held_out(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """(name, encoded sample) of the held-out items, at most ``evaluate.limit``, and how many
        of ``evaluate.datasets`` were bad samples (skipped and counted when the data section says
        ``on_bad_sample: skip``)."""
        import torch
        from transformers import AutoTokenizer

        from mmcore.data.media import MediaError
        from mmcore.data.mllm import read_samples
        from mmcore.data.shards import ShardDataset
        from mmcore.generation import read_held_out

        cfg = ctx.config.evaluate
        if not cfg.datasets:
            from mmcore.kits.vlm_dpo import chosen_view

            data = ShardDataset(upstream["preprocess"].output("dataset")).split("eval")  # pairs: their chosen answers
            return [(data.meta(i).get("source", str(i)), chosen_view(data[i])) for i in range(min(cfg.limit, len(data)))], 0
        folder = upstream["download"].output("model")
        encoder = self.encoder(ctx, folder, AutoTokenizer.from_pretrained(folder, **remote_code()))

        def encode(sample: Any) -> dict[str, Any]:
            encoded = encoder.encode(sample)
            return {"input_ids": torch.tensor(encoded.input_ids), "labels": torch.tensor(encoded.labels), **encoded.tensors}

        return read_held_out(ctx, lambda path: read_samples(path, ctx.config.data), encode, (MediaError, ValueError))


def with_tail(samples: list[dict[str, Any]], fillers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``samples`` with ``fillers`` appended to the last one (:func:`mmcore.data.fillers.append_fillers`)."""
    from mmcore.data.fillers import append_fillers

    return [*samples[:-1], append_fillers(samples[-1], fillers)] if fillers else samples


def balance_loss_without_fillers(model: Any, out: Any, batch: Batch) -> Any:
    """The router's load-balancing loss as the family's transformers module computes it, over
    the batch's tokens less the filler's tail (:mod:`mmcore.data.fillers`): filler tokens would
    otherwise move the routers' balance, and through it send gradients into the towers."""
    import sys

    import torch

    mask = batch["attention_mask"].clone() if "attention_mask" in batch else torch.ones_like(batch["input_ids"])
    end = int(mask[-1].sum())  # the last row's tokens; the filler is the tail of its last sample
    mask[-1, end - int(batch["filler_tokens"]) : end] = 0
    family = next(c for c in type(model).__mro__ if c.__module__.startswith("transformers.models."))
    balance = sys.modules[family.__module__].load_balancing_loss_func
    return balance(out.router_logits, out.router_logits[0].shape[-1], model.config.get_text_config().num_experts_per_tok, mask)


def torch_tensor(values: list[int]) -> Any:
    import torch

    return torch.tensor(values, dtype=torch.long)


def rows_of(*fields: str) -> Callable[[Batch], float]:
    """``batch -> tokens``: the rows of those batch fields (patches of ``pixel_values``)."""
    return lambda batch: float(sum(batch[f].shape[0] for f in fields if f in batch))


def restarting_positions(model: Any, batch: Batch) -> Any:
    """1-D positions restarting at every sample of a packed row ([1, total]); transformers reads
    the restarts to keep the samples' attention apart."""
    import torch

    return torch.cat([torch.arange(int(n)) for n in batch["segments"]])[None].to(batch["input_ids"].device)


__all__ = ["VLMFamily", "restarting_positions", "rows_of"]
