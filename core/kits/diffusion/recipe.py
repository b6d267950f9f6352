"""The diffusion kit's part of training (``training.method: sft``): :class:`DiffusionRecipe`, the
train engine's :class:`~mmcore.train.TrainRecipe` of a :class:`DiffusionFamily`.

The family's objective (:mod:`mmcore.kits.diffusion.objectives`) at noise levels drawn per
sample, captions dropped with ``training.caption_dropout`` for classifier-free guidance, each
sample's draws from its own seed (so 2 ranks train as 1 does); from the feature cache after an
extract stage, or encoding each batch afresh without one (the same numbers either way). With
``data.eval_fraction``, the held-out clips' error at fixed noise levels and noise
(``eval/loss``): what says a run learns where the training loss is noisy.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.kits import blocks_at
from mmcore.kits.diffusion.batches import collate, encode
from mmcore.kits.diffusion.flops import denoiser_flops
from mmcore.kits.diffusion.latents import is_named, tree_map
from mmcore.kits.diffusion.objectives import FlowMatching, diffusion_loss
from mmcore.run.rundir import Manifest
from mmcore.train import TrainRecipe

if TYPE_CHECKING:
    from mmcore.kits.diffusion.family import DiffusionFamily


class DiffusionRecipe(TrainRecipe):
    """Training of ``family``'s denoiser (the expert ``training.expert`` names, on its noise
    levels) on the preprocessed clips ``data`` (a :class:`~mmcore.data.shards.ShardDataset`)."""

    loss_unit = "samples"
    sample_seeds = True  # 2 ranks draw what 1 does
    ulysses = True  # the denoiser's tokens split over parallel.ulysses ranks (build_model, collate, loss)

    def __init__(self, family: "DiffusionFamily", ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> None:
        super().__init__()
        self.family = family
        self.cfg = ctx.config.training
        self.model_dir: Path = upstream["download"].output("model")
        self.subfolder, levels = family.expert(ctx, self.model_dir)
        if data.index.get("ranking"):
            raise StageError("the dataset holds preference pairs (data.ranking): train them with training.method: dpo")
        self.train = data.split("train")
        self.train_samples, self.empty_text, self.encoders = family.samples(ctx, upstream, self.train)
        self.held = held = data.split("eval")
        self.held_samples, _, self.held_encoders = family.samples(ctx, upstream, held) if len(held) else (None, None, None)
        self.predict = family.predictor(ctx, self.model_dir)
        self.objective = family.objective(self.model_dir)
        if levels != (0.0, 1.0):
            if not isinstance(self.objective, FlowMatching):
                raise StageError("training.expert: only flow-matching families have experts split by noise level")
            self.objective = FlowMatching(levels, self.objective.weights)
        self.freeze_groups = family.freeze_groups
        self.step_flops = (family.flops or denoiser_flops)()
        self.sequence = ctx.config.parallel.ulysses  # ranks sharing each sample's tokens
        self.sequence_rank = ctx.world.rank % self.sequence

    # -- the model ---------------------------------------------------------------------------

    def build_model(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        model = self.family.build_model(self.model_dir, subfolder=self.subfolder)
        if self.sequence > 1:
            from mmcore.backends.ulysses import use_ulysses_denoiser

            try:
                use_ulysses_denoiser(model, ctx.world.rank, ctx.world.world_size, self.sequence, ctx.accelerator.device(ctx.world.local_rank))
            except ValueError as e:
                raise StageError(str(e)) from None
        return model

    def weights(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Path:
        return upstream["convert"].output("checkpoint")

    def shard_modules(self, model: Any) -> list[Any]:
        return blocks_at(model, self.family.shard_layers)

    def flops(self, model: Any, batch: dict[str, Any]) -> float:
        return self.step_flops(model, batch) / self.sequence  # a sequence group shares the sample's work

    # -- the data ----------------------------------------------------------------------------

    def dataset(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Sequence[Any]:
        return self.train_samples

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        batch = collate(samples)
        if self.sequence_rank:  # parallel.ulysses: the group's first rank counts its samples (split_sum)
            batch["num_loss_tokens"] = 0
        return batch

    def group_of(self, index: int) -> Any:
        return tuple(self.train.meta(index)["bucket"])  # latents of one micro-batch must stack

    # -- the loss ----------------------------------------------------------------------------

    def loss(self, model: Any, batch: dict[str, Any]) -> Any:
        """The batch's summed error (:func:`~mmcore.kits.diffusion.objectives.diffusion_loss`),
        each sample's draws from its ``sample_seeds``."""
        encode(batch, self.encoders, self.family.conditions)
        device = next(model.parameters()).device
        loss = diffusion_loss(
            self.objective, self.conditioned(batch, device), model, tree_map(lambda x: x.to(device), batch["latents"]), batch["text"].to(device), self.empty_text, self.cfg, batch.get("sample_seeds")
        )
        if self.sequence > 1:
            from mmcore.backends.ulysses import split_sum

            return split_sum(loss, self.sequence)
        return loss

    def conditioned(self, batch: dict[str, Any], device: Any, repeat: int = 1) -> Callable[..., Any]:
        """``predict`` with the batch's conditions bound (each sample's ``repeat`` times in a row)."""
        if not self.family.conditions:
            return self.predict
        return functools.partial(self.predict, **{name: batch[name].to(device).repeat_interleave(repeat, dim=0) for name in self.family.conditions})

    def evaluate(self, ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """The objective's error on held-out clips at fixed noise levels (``EVAL_SIGMAS``) with
        fixed noise per clip: comparable across steps and runs, unlike the training loss
        (``loss``); the same error with each clip given another held-out clip's caption
        (``loss_shuffled``, :func:`caption_partners`), and their ratio ``caption_sensitivity``:
        a denoiser that ignores its caption stays at 1.0 however low its loss falls. A family with
        ``conditions`` (image-to-video's first frame) also gets ``loss_other_condition``: its own
        caption with another clip's conditions, and ``condition_sensitivity`` (over ``loss``)."""
        import torch

        if self.held_samples is None:
            return {}
        device = next(model.parameters()).device
        count = min(len(self.held_samples), 256)
        batches = []
        for i in range(count):
            batch = collate([self.held_samples[i]])
            encode(batch, self.held_encoders, self.family.conditions)
            batches.append(batch)
        partners = caption_partners([self.held.meta(i).get("caption", "") for i in range(count)])
        right = shuffled = other_condition = 0.0
        with torch.no_grad():
            for i, batch in enumerate(batches):
                latents = tree_map(lambda x: x.to(device), batch["latents"])
                levels = self.objective.eval_levels().to(device)
                count_levels = len(levels)
                generator = torch.Generator().manual_seed(ctx.seed * 100_003 + i)  # named latents: drawn in name order
                noise = (
                    {n: torch.randn((count_levels, *latents[n].shape[1:]), generator=generator).to(device) for n in sorted(latents)}
                    if is_named(latents)
                    else torch.randn((count_levels, *latents.shape[1:]), generator=generator).to(device)
                )
                clean = tree_map(lambda x: x.expand(count_levels, *x.shape[1:]), latents)
                error = lambda predict, text: float(self.objective.errors(predict, model, clean, noise, levels, text.to(device).expand(count_levels, *text.shape[1:])).mean())  # noqa: E731
                predict = self.conditioned(batch, device, count_levels)
                right += error(predict, batch["text"])
                shuffled += error(predict, batches[partners[i]]["text"] if partners[i] is not None else self.empty_text[None])
                if self.family.conditions:  # its own caption, the partner's first frame (or whatever conditions it)
                    other_condition += error(self.conditioned(batches[partners[i] if partners[i] is not None else (i + 1) % count], device, count_levels), batch["text"])
        loss, loss_shuffled = right / count, shuffled / count
        metrics = {"loss": loss, "loss_shuffled": loss_shuffled, "caption_sensitivity": loss_shuffled / loss if loss > 0 else 1.0}
        if self.family.conditions:
            metrics |= {"loss_other_condition": other_condition / count, "condition_sensitivity": other_condition / count / loss if loss > 0 else 1.0}
        return metrics


def caption_partners(captions: Sequence[str]) -> list[int | None]:
    """For each caption, the index of the next one (cyclically) that differs from it, whose
    embedding stands in for it in ``loss_shuffled``; None where every caption is the same (the
    empty caption stands in). Deterministic, so the ratio compares across steps and runs."""
    n = len(captions)
    return [next(((i + k) % n for k in range(1, n) if captions[(i + k) % n] != captions[i]), None) for i in range(n)]


__all__ = ["DiffusionRecipe", "caption_partners"]
