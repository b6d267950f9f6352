"""DPO for the VLM kit: the train engine's recipe on preference pairs (:mod:`mmcore.train.preference`),
:class:`VLMDPORecipe`.

A micro-batch of pairs is one batch of rows, every pair's chosen row first, then the rejected
ones, each with the pair's media (or, with ``training.packing``, one packed row holding both
answers of every pair: a pair never straddles micro-batches). The loss is the sum over pairs
of the sigmoid DPO loss; the engine divides by the pairs of the global batch. Where the family
keeps kinds of media apart (``VLMFamily.batch_apart``: GLM-4V), so do the micro-batches of
training, of the reference pass and of evaluation. The model, its weights, FLOPs, shards and
fillers are the SFT recipe's (:class:`~mmcore.kits.vlm.recipe.VLMRecipe`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.kits.vlm.batches import Batch, with_tail
from mmcore.kits.vlm.pairs import PAIR_FIELDS, PairSamples, answer_views, chosen_view
from mmcore.kits.vlm.recipe import VLMRecipe
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.vlm.family import VLMFamily


class VLMDPORecipe(VLMRecipe):
    """The train engine's DPO recipe of ``family`` on the preference pairs preprocess wrote
    (``data.ranking``); the reference is the base with the adapters off (LoRA) or the starting
    model's log-probabilities computed once (``training.dpo.reference``)."""

    loss_unit = "pairs"
    method = "dpo"
    ulysses = False  # pairs are padded rows, not split (parallel.ulysses: supervised fine-tuning)

    def __init__(self, family: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        from mmcore.train.preference import reference_mode

        super().__init__(family, ctx, upstream)
        cfg = ctx.config.training
        self.mode = reference_mode(cfg)
        self.beta, self.sft_weight, self.micro_batch_size = cfg.dpo.beta, cfg.dpo.sft_weight, cfg.micro_batch_size
        self.held_pairs = self.samples("eval")
        self.device = ctx.accelerator.device(ctx.world.local_rank)
        self.reference: Any = None  # precomputed: the reference log-probabilities (prepare)
        self.sums: dict[str, Any] = {}  # the step's reward sums, until step_metrics reads them

    def check(self, index: Mapping[str, Any], ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        if not index.get("ranking"):
            raise StageError("training.method=dpo trains on preference pairs: preprocess them with data.ranking: true (a prompt with chosen and rejected answers)")
        if "extract" in upstream:
            raise StageError("training.method=dpo reads the towers live: the feature cache holds single samples (set extract.enabled: false)")

    def samples(self, split: str) -> PairSamples:
        from mmcore.data.shards import ShardDataset

        return PairSamples(ShardDataset(self.dataset_dir).split(split))

    def collate(self, samples: list[dict[str, Any]], fillers: list[dict[str, Any]] | None = None) -> Batch:  # type: ignore[override]
        """Both answers of every pair as rows (chosen first), ``fillers`` after the last rejected one."""
        import torch

        batch = self.family.collate(with_tail(answer_views(samples), fillers or []), self.ids, pack=self.packing)
        batch["num_loss_tokens"] = len(samples)  # the loss unit is the pair
        batch["pair_index"] = torch.tensor([s["pair_index"] for s in samples])
        return batch

    def collate_filled(self, samples: list[dict[str, Any]], fillers: list[dict[str, Any]]) -> Batch:
        return self.collate(samples, fillers)

    # -- the loss ------------------------------------------------------------------------------

    def logps(self, model: Any, batch: Batch) -> tuple[Any, Any]:
        """(summed log-probability of each row's answer, its token count)."""
        from mmcore.train.preference import sequence_logps

        return sequence_logps(self.family.forward_logits(model, batch), batch["labels"], batch.get("segments"))

    def rewards(self, model: Any, batch: Batch, split: str) -> tuple[Any, Any, Any, Any]:
        """(per-pair loss, chosen rewards, rejected rewards, chosen token counts)."""
        import torch

        from mmcore.train.lora import adapters_disabled
        from mmcore.train.preference import dpo_terms

        n = int(batch["num_loss_tokens"])
        sums, counts = self.logps(model, batch)
        if self.mode == "adapters_off":
            with torch.no_grad(), adapters_disabled(model):
                ref, _ = self.logps(model, batch)
            ref_chosen, ref_rejected = ref[:n], ref[n:]
        else:
            ref_chosen, ref_rejected = (t.to(sums.device) for t in self.reference.lookup(split, batch["pair_index"]))
        losses, chosen, rejected = dpo_terms(sums[:n], sums[n:], ref_chosen, ref_rejected, self.beta)
        if self.sft_weight:
            losses = losses + self.sft_weight * (-sums[:n] / counts[:n].clamp(min=1))
        return losses, chosen, rejected, counts[:n]

    def loss(self, model: Any, batch: Batch) -> Any:
        from mmcore.train.preference import reward_sums

        losses, chosen, rejected, _ = self.rewards(model, batch, "train")
        for name, value in reward_sums(chosen, rejected).items():
            self.sums[name] = self.sums.get(name, 0) + value
        return losses.sum()

    def step_metrics(self) -> dict[str, Any]:
        sums, self.sums = self.sums, {}
        return sums

    # -- the reference and the held-out pairs --------------------------------------------------

    def batches(self, data: PairSamples, limit: int | None = None) -> Iterator[Batch]:
        """Micro-batches in order, one kind of ``batch_apart`` media per batch, on the device."""
        import torch

        count = len(data) if limit is None else min(limit, len(data))
        kind, kinds = self.family.group_of(data), {}  # type: ignore[var-annotated]
        for i in range(count):
            kinds.setdefault(kind(i), []).append(i)
        size = self.micro_batch_size
        for members in kinds.values():
            for start in range(0, len(members), size):
                batch = self.collate([data[i] for i in members[start : start + size]])
                yield {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def prepare(self, ctx: StageContext, model: Any) -> None:
        """``precomputed``: the starting model's log-probabilities of every pair's answers."""
        import torch

        from mmcore.train.preference import ReferenceLogps

        if self.mode != "precomputed":
            return

        def compute(split: str, data: PairSamples) -> Any:
            table = torch.zeros(len(data), 2)
            for batch in self.batches(data):  # kinds apart, so not in pair order: rows go to their pairs
                n = int(batch["num_loss_tokens"])
                sums, _ = self.logps(model, batch)
                table[batch["pair_index"].cpu()] = torch.stack([sums[:n], sums[n:]], dim=1).detach().float().cpu()
            return table

        world = ctx.world
        splits = {"train": self.train, "eval": self.held_pairs}
        self.reference = ReferenceLogps.load_or_compute(ctx.stage_dir, splits, compute, is_main=world.is_main, distributed=world.distributed)

    def evaluate(self, ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """Held-out reward accuracy (a tie counts half) and mean rewards and margin."""
        from mmcore.train.preference import reward_sums

        held = self.held_pairs
        if not len(held):
            return {}
        totals: dict[str, float] = {}
        seen = 0
        for batch in self.batches(held, limit=256):
            _, chosen, rejected, _ = self.rewards(model, batch, "eval")
            for name, value in reward_sums(chosen, rejected).items():
                totals[name] = totals.get(name, 0.0) + float(value)
            seen += int(batch["num_loss_tokens"])
        return {name: value / seen for name, value in totals.items()}


def dpo_recipe(family: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> VLMDPORecipe:
    """The DPO recipe of ``family`` (SDK 1.x's function; :class:`VLMDPORecipe`)."""
    return VLMDPORecipe(family, ctx, upstream)


__all__ = ["VLMDPORecipe", "dpo_recipe", "answer_views", "chosen_view", "PairSamples", "PAIR_FIELDS"]
