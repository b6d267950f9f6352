"""The VLM kit's train recipe: what the train engine (:func:`mmcore.train.run_training`) asks
of a :class:`~mmcore.kits.vlm.VLMFamily` for supervised fine-tuning, as the methods of
:class:`VLMRecipe`.

Summed next-token loss over the collated rows (padded, or packed with ``training.packing``),
FSDP units from ``shard_layers``, ``freeze_groups`` for ``training.freeze``, exact-match accuracy
on the held-out split; with a finished extract stage the samples read its feature cache
(``cache_replaces``) and ``prepare_model`` switches the frozen towers to cached inputs. A rank
whose micro-batch lacks a kind of media another rank's holds appends the dataset's filler
sample of that kind (:meth:`VLMRecipe.fill_of`), so every rank runs the same towers.

A family that runs on megatron-core gets :class:`VLMMegatronRecipe`, which also answers the
megatron backend's :class:`~mmcore.backends.megatron.family.MegatronRecipe` protocol.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.train.causal_lm import evaluate_accuracy
from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.kits.vlm.batches import Batch, with_tail
from mmcore.run.rundir import Manifest
from mmcore.train import TrainRecipe

if TYPE_CHECKING:
    from mmcore.data.fillers import Fill
    from mmcore.kits.vlm.family import VLMFamily
    from mmcore.backends.megatron.family import MegatronFamily

#: ``(samples, fillers) -> batch``: a micro-batch with filler samples appended to its last sample
FilledCollate = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Batch]


class VLMRecipe(TrainRecipe):
    """The train engine's SFT recipe of ``family``, for the run of ``ctx`` after ``upstream``
    (preprocess's dataset, convert's checkpoint, the extract stage's cache where it ran)."""

    ulysses = True  # packed rows split over parallel.ulysses ranks (build_model, collate, loss)

    def __init__(self, family: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        from mmcore.data.shards import ShardDataset

        super().__init__()
        self.family, self.upstream = family, upstream
        self.dataset_dir: Path = upstream["preprocess"].output("dataset")
        self.check(ShardDataset(self.dataset_dir).index, ctx, upstream)
        self.ids = family.token_ids(ShardDataset(self.dataset_dir))
        self.packing = ctx.config.training.packing
        self.sequence = ctx.config.parallel.ulysses  # ranks sharing each packed row (parallel.ulysses)
        self.sequence_rank = ctx.world.rank % self.sequence
        self.aux_coef = ctx.config.training.moe_aux_loss_coef
        self.freeze_groups = family.freeze_groups
        self.lora_targets = family.lora_targets
        self.train = self.samples("train")
        self.fill = self.fill_of(self.train.meta, self.collate_filled)
        self.count_flops = family.step_flops()
        self.kind = family.group_of(self.train)
        if not family.batch_apart:  # any sample may share a micro-batch with any other
            self.group_of = None  # type: ignore[assignment]

    def check(self, index: Mapping[str, Any], ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        """Refuse a dataset this recipe does not train (``index``: preprocess's dataset index)."""
        if index.get("ranking") and ctx.config.training.method != "dpo":
            raise StageError("the dataset holds preference pairs (data.ranking): train them with training.method: dpo")

    def samples(self, split: str) -> Any:
        """The samples of ``split`` (``train``, ``eval``), read through the feature cache where
        the extract stage ran."""
        from mmcore.data.shards import ShardDataset

        data = ShardDataset(self.dataset_dir).split(split)
        if "extract" in self.upstream:
            from mmcore.data.feature_cache import CachedSamples

            return CachedSamples(data, self.upstream["extract"].output("features"), replaces=dict(self.family.cache_replaces))
        return data

    # -- the model -----------------------------------------------------------------------------

    def build_model(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        """The model without its weights (the engine loads :meth:`weights`), the family's kernels
        and cached towers in place (``prepare_model``), packed attention with ``training.packing``."""
        family = self.family
        model = family.build_model(upstream["download"].output("model"))
        if family.prepare_model is not None:
            family.prepare_model(ctx, model, upstream)
        if self.packing and family.packed_attention:
            from mmcore.train.attention import packed_attention_forward, use_packed_attention, varlen_attention

            kernel = ctx.kernel("varlen_attention") if ctx.plugins is not None else varlen_attention
            use_packed_attention(model, kernel)
            if self.sequence > 1:
                self.split_sequences(ctx, model, functools.partial(packed_attention_forward, kernel=kernel))
        elif self.sequence > 1 and not self.packing:
            raise StageError("parallel.ulysses splits packed rows: set training.packing: true")
        elif self.sequence > 1:
            raise StageError(f"parallel.ulysses: pack {ctx.pack!r}'s decoder does not run packed attention (its mask is not causal), which the split needs")
        return model

    def split_sequences(self, ctx: StageContext, model: Any, attention: Callable[..., Any]) -> None:
        """``parallel.ulysses``: the text decoder runs on this rank's slice of each packed row,
        ``attention`` on the whole row (:mod:`mmcore.backends.ulysses`)."""
        from mmcore.backends.ulysses import SequenceGroup, use_ulysses
        from mmcore.backends.ulysses_towers import split_tower_frames

        routed = self.family.router_aux_loss and getattr(model.config.get_text_config(), "router_aux_loss_coef", None)
        if routed and self.aux_coef != 0:
            raise StageError("parallel.ulysses does not yet split the routers' load-balancing loss: set training.moe_aux_loss_coef: 0")
        self.sequence_group = SequenceGroup.create(ctx.world.rank, ctx.world.world_size, self.sequence)
        use_ulysses(model, attention)
        for path in self.family.frame_towers:
            tower = model.get_submodule(path)
            split_tower_frames(tower, int(tower.spatial_merge_size))
            ctx.say(f"parallel.ulysses: the {self.sequence} ranks of a sequence group split {path}'s frames")

    def weights(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Path:
        return upstream["convert"].output("checkpoint")

    def shard_modules(self, model: Any) -> list[Any]:
        return self.family.shard_modules(model)

    def flops(self, model: Any, batch: Batch) -> float:
        return self.count_flops(model, batch) / self.sequence  # a sequence group shares the row's work

    # -- the data ------------------------------------------------------------------------------

    def dataset(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Sequence[Any]:
        return self.train

    def length_of(self, i: int) -> int:
        return self.train.length(i)

    def work_of(self, i: int) -> float:
        return float(self.train.meta(i).get("tower_tokens", 0))

    def group_of(self, i: int) -> tuple[bool, ...]:  # type: ignore[override]
        """Which of ``batch_apart``'s fields sample ``i`` has (None where the family has none)."""
        return self.kind(i)

    def collate(self, samples: list[dict[str, Any]]) -> Batch:
        if self.sequence == 1:
            return self.family.collate(samples, self.ids, pack=self.packing)
        from mmcore.backends.ulysses import pad_sample, shard_labels

        pad = pad_sample(sum(len(s["input_ids"]) for s in samples), self.sequence, self.ids["pad_id"])
        batch = self.family.collate([*samples, pad] if pad is not None else samples, self.ids, pack=True)
        return shard_labels(batch, self.sequence_rank, self.sequence)

    def collate_filled(self, samples: list[dict[str, Any]], fillers: list[dict[str, Any]]) -> Batch:
        """A micro-batch with ``fillers`` appended to its last sample (:func:`with_tail`)."""
        return self.collate(with_tail(samples, fillers))

    # -- the step and the held-out split -------------------------------------------------------

    def loss(self, model: Any, batch: Batch) -> Any:
        if "shard_labels" in batch:  # parallel.ulysses: this rank's slice of the row
            from mmcore.backends.ulysses import shard_loss_sum, sharded

            with sharded(self.sequence_group):
                return shard_loss_sum(self.family.forward_logits(model, batch), batch)
        return self.family.loss_sum(model, batch, self.aux_coef)

    def evaluate(self, ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """Exact-match accuracy on the held-out split, one sample per forward, the work split
        across ranks."""
        data, fill = self.held_split
        return evaluate_accuracy(ctx, model, data, lambda s: self.family.collate([s], self.ids), self.family.forward_logits, fill=fill)

    @functools.cached_property
    def held_split(self) -> tuple[Any, "Fill"]:
        """The held-out samples and their fill (padded rows), read when first evaluated."""
        data = self.samples("eval")
        return data, self.fill_of(data.meta, lambda samples, tail: self.family.collate(with_tail(samples, tail), self.ids))

    def fill_of(self, meta: Callable[[int], Mapping[str, Any]], collate: FilledCollate) -> "Fill":
        """The :class:`~mmcore.data.fillers.Fill` over the samples ``meta`` describes: the
        dataset's filler samples (read through the feature cache where samples are), handed to
        ``collate(samples, fillers)``, which appends them to the tail of the micro-batch's last
        row (:func:`with_tail`)."""
        from mmcore.data.fillers import Fill, kinds_by_fields
        from mmcore.data.shards import ShardDataset

        dataset_dir = self.dataset_dir
        records = ShardDataset(dataset_dir).fillers()
        if not len(records):  # preprocessed before fillers existed: mixed media across ranks cannot be evened

            def refuse(samples: list[dict[str, Any]], wanted: Sequence[str]) -> Batch:
                raise StageError(
                    f"{dataset_dir}: this dataset mixes samples with and without media across processes, and was preprocessed "
                    "by an mmcore without filler samples: rerun preprocess (mmcore preprocess --force ...)"
                )

            return Fill(("media",), lambda i: {"media"} if meta(i).get("media") else set(), refuse)
        view: Any = records
        if "extract" in self.upstream:
            from mmcore.data.feature_cache import CachedSamples

            view = CachedSamples(records, self.upstream["extract"].output("features"), replaces=dict(self.family.cache_replaces))
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


class VLMMegatronRecipe(VLMRecipe):
    """:class:`VLMRecipe` of a family that runs on megatron-core: ``part`` is its ``model folder
    -> MegatronFamily`` (:class:`~mmcore.backends.megatron.family.MegatronPart`); the recipe answers
    :class:`~mmcore.backends.megatron.family.MegatronRecipe` for ``parallel.backend: megatron``."""

    def __init__(self, family: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest], part: Callable[[Path], "MegatronFamily"]) -> None:
        super().__init__(family, ctx, upstream)
        self.part = part

    def megatron_family(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> "MegatronFamily":
        """The family's megatron part of the downloaded checkpoint, with the held-out split it
        scores during training."""
        return dataclasses.replace(self.part(upstream["download"].output("model")), held_out=self.samples("eval"), collate_one=lambda s: self.family.collate([s], self.ids))


__all__ = ["VLMRecipe", "VLMMegatronRecipe", "FilledCollate"]
