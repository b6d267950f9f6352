"""DPO for the VLM kit: the train engine's recipe on preference pairs (:mod:`mmcore.preference`).

A micro-batch of pairs is one batch of rows, every pair's chosen row first, then the rejected
ones, each with the pair's media (or, with ``training.packing``, one packed row holding both
answers of every pair: a pair never straddles micro-batches). The loss is the sum over pairs
of the sigmoid DPO loss; the engine divides by the pairs of the global batch. Where the family
keeps kinds of media apart (``VLMFamily.batch_apart``: GLM-4V), so do the micro-batches of
training, of the reference pass and of evaluation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.vlm import VLMFamily

PAIR_FIELDS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")


class PairSamples:
    """A split of a preference dataset whose items carry their index (for the reference table)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.data[i], "pair_index": i}

    def length(self, i: int) -> int:
        return self.data.length(i)

    def meta(self, i: int) -> dict[str, Any]:
        return self.data.meta(i)


def answer_views(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chosen row of every pair, then the rejected rows, each with the pair's media."""
    def media(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k not in PAIR_FIELDS and k != "pair_index"}

    return ([{"input_ids": s["chosen_input_ids"], "labels": s["chosen_labels"], **media(s)} for s in samples]
            + [{"input_ids": s["rejected_input_ids"], "labels": s["rejected_labels"], **media(s)} for s in samples])


def chosen_view(sample: dict[str, Any]) -> dict[str, Any]:
    """A pair as the SFT sample of its chosen answer (what evaluate answers and scores against)."""
    return answer_views([sample])[0] if "chosen_input_ids" in sample else sample


def dpo_recipe(family: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
    import torch

    from mmcore.data.shards import ShardDataset
    from mmcore.kits.vlm import with_tail
    from mmcore.lora import adapters_disabled
    from mmcore.preference import ReferenceLogps, dpo_terms, reference_mode, reward_sums, sequence_logps
    from mmcore.train import TrainRecipe

    cfg = ctx.config.training
    dataset_dir = upstream["preprocess"].output("dataset")
    index = ShardDataset(dataset_dir).index
    if not index.get("ranking"):
        raise StageError("training.method=dpo trains on preference pairs: preprocess them with data.ranking: true (a prompt with chosen and rejected answers)")
    if "extract" in upstream:
        raise StageError("training.method=dpo reads the towers live: the feature cache holds single samples (set extract.enabled: false)")
    ids = family.token_ids(ShardDataset(dataset_dir))
    packing = cfg.packing
    mode = reference_mode(cfg)
    beta, sft_weight = cfg.dpo.beta, cfg.dpo.sft_weight
    splits = {name: PairSamples(ShardDataset(dataset_dir).split(name)) for name in ("train", "eval")}
    device = ctx.accelerator.device(ctx.world.local_rank)
    state: dict[str, Any] = {"reference": None, "sums": {}}

    def collate(samples: list[dict[str, Any]], fillers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        batch = family.collate(with_tail(answer_views(samples), fillers or []), ids, pack=packing)  # fillers: after the last rejected answer
        batch["num_loss_tokens"] = len(samples)  # the loss unit is the pair
        batch["pair_index"] = torch.tensor([s["pair_index"] for s in samples])
        return batch

    def logps(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        return sequence_logps(family.forward_logits(model, batch), batch["labels"], batch.get("segments"))

    def rewards(model: Any, batch: dict[str, Any], split: str) -> tuple[Any, Any, Any, Any]:
        """(per-pair loss, chosen rewards, rejected rewards, chosen token counts)."""
        n = int(batch["num_loss_tokens"])
        sums, counts = logps(model, batch)
        if mode == "adapters_off":
            with torch.no_grad(), adapters_disabled(model):
                ref, _ = logps(model, batch)
            ref_chosen, ref_rejected = ref[:n], ref[n:]
        else:
            ref_chosen, ref_rejected = (t.to(sums.device) for t in state["reference"].lookup(split, batch["pair_index"]))
        losses, chosen, rejected = dpo_terms(sums[:n], sums[n:], ref_chosen, ref_rejected, beta)
        if sft_weight:
            losses = losses + sft_weight * (-sums[:n] / counts[:n].clamp(min=1))
        return losses, chosen, rejected, counts[:n]

    def loss(model: Any, batch: dict[str, Any]) -> Any:
        losses, chosen, rejected, _ = rewards(model, batch, "train")
        for name, value in reward_sums(chosen, rejected).items():
            state["sums"][name] = state["sums"].get(name, 0) + value
        return losses.sum()

    def step_metrics() -> dict[str, Any]:
        sums, state["sums"] = state["sums"], {}
        return sums

    def batches(data: PairSamples, limit: int | None = None) -> Any:
        """Micro-batches in order, one kind of ``batch_apart`` media per batch."""
        count = len(data) if limit is None else min(limit, len(data))
        kind, kinds = family.group_of(data), {}  # type: ignore[var-annotated]
        for i in range(count):
            kinds.setdefault(kind(i), []).append(i)
        size = cfg.micro_batch_size
        for members in kinds.values():
            for start in range(0, len(members), size):
                batch = collate([data[i] for i in members[start : start + size]])
                yield {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def prepare(ctx: StageContext, model: Any) -> None:
        if mode != "precomputed":
            return

        def compute(split: str, data: PairSamples) -> Any:
            table = torch.zeros(len(data), 2)
            for batch in batches(data):  # kinds apart, so not in pair order: rows go to their pairs
                n = int(batch["num_loss_tokens"])
                sums, _ = logps(model, batch)
                table[batch["pair_index"].cpu()] = torch.stack([sums[:n], sums[n:]], dim=1).detach().float().cpu()
            return table

        world = ctx.world
        state["reference"] = ReferenceLogps.load_or_compute(ctx.stage_dir, dict(splits), compute, is_main=world.is_main, distributed=world.distributed)

    def evaluate(ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """Held-out reward accuracy (a tie counts half) and mean rewards and margin."""
        held = splits["eval"]
        if not len(held):
            return {}
        totals: dict[str, float] = {}
        seen = 0
        for batch in batches(held, limit=256):
            _, chosen, rejected, _ = rewards(model, batch, "eval")
            for name, value in reward_sums(chosen, rejected).items():
                totals[name] = totals.get(name, 0.0) + float(value)
            seen += int(batch["num_loss_tokens"])
        return {name: value / seen for name, value in totals.items()}

    base = family.sft_recipe(ctx, upstream)
    return TrainRecipe(
        build_model=base.build_model,
        weights=base.weights,
        flops=base.flops,
        dataset=lambda ctx, upstream: splits["train"],
        length_of=splits["train"].length,
        collate=collate,
        loss=loss,
        shard_modules=base.shard_modules,
        freeze_groups=base.freeze_groups,
        lora_targets=base.lora_targets,
        evaluate=evaluate,
        loss_unit="pairs",
        group_of=family.group_of(splits["train"]) if family.batch_apart else None,
        prepare=prepare,
        step_metrics=step_metrics,
        fill=family.fill(dataset_dir, upstream, splits["train"].meta, collate),
        work_of=base.work_of,
    )


__all__ = ["dpo_recipe", "answer_views", "chosen_view", "PairSamples"]
