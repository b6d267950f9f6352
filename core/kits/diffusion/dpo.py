"""Diffusion-DPO for the diffusion kit (Wallace et al. 2023), on the family's objective.

A pair is one caption with a preferred (w) and a dispreferred (l) video, from the feature cache
(or encoded per batch). Both get the same noise level and the same noise; with ``e`` the
objective's error per element, averaged over the latent (flow matching: ``|| v_hat - (noise -
x) ||^2``, as in :func:`mmcore.kits.diffusion.objectives.diffusion_loss`), the per-pair loss is

    -log sigmoid( -(beta * T / 2) * ((e_w - e_w_ref) - (e_l - e_l_ref)) ),   T = 1000

the paper's form with its ``beta * T`` (T: the 1000 timesteps the paper's models discretise; its
Stable Diffusion 1.5 setting ``beta_T = 5000`` is ``training.dpo.beta: 5``) and its 1/2 (as in
diffusers' reference script). The reference is the frozen base: the LoRA adapters switched off
(a reference needs the same noise as the policy, so it cannot be computed once ahead), hence
Diffusion-DPO trains LoRA adapters. The implicit accuracy is the share of pairs where the
argument above is positive (a tie, as at the start, counts half). Each pair's caption dropout,
noise level and noise come from its own seed (``TrainRecipe.sample_seeds``), as in SFT
(:class:`mmcore.kits.diffusion.recipe.DiffusionRecipe`).

Held-out pairs (``data.eval_fraction``) are measured at the objective's fixed noise levels
(:data:`mmcore.kits.diffusion.objectives.EVAL_SIGMAS`) with fixed noise (drawn from ``run.seed`` and the pair's index), without
caption dropout, the sigmoid's arguments summed over the levels: the figure moves only with the
weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.kits import blocks_at
from mmcore.kits.diffusion.batches import collate, encode
from mmcore.kits.diffusion.flops import denoiser_flops
from mmcore.run.rundir import Manifest
from mmcore.train import TrainRecipe

if TYPE_CHECKING:
    from mmcore.kits.diffusion.family import DiffusionFamily

TIMESTEPS = 1000


def diffusion_dpo_terms(objective: Any, predict: Any, model: Any, winners: Any, losers: Any, text: Any, levels: Any, noise: Any, beta: float) -> tuple[Any, Any]:
    """(per-pair loss, per-pair argument of the sigmoid): policy errors with gradients, the
    reference's with the adapters off and without; ``objective`` as the family's
    (:class:`mmcore.kits.diffusion.objectives.FlowMatching`, ``NoiseSchedule``)."""
    import torch
    import torch.nn.functional as F

    from mmcore.train.lora import adapters_disabled

    pairs = winners.shape[0]
    both = torch.cat([winners, losers])
    twice = lambda t: torch.cat([t, t])  # noqa: E731 - the same caption, noise level and noise for w and l
    errors = objective.errors(predict, model, both, twice(noise), twice(levels), twice(text))
    with torch.no_grad(), adapters_disabled(model):
        ref = objective.errors(predict, model, both, twice(noise), twice(levels), twice(text))
    inside = -0.5 * beta * TIMESTEPS * ((errors[:pairs] - ref[:pairs]) - (errors[pairs:] - ref[pairs:]))
    return -F.logsigmoid(inside), inside.detach()


def accuracy_sum(inside: Any) -> Any:
    """The pairs where the sigmoid's argument is positive (a tie counts half)."""
    return ((inside > 0).float() + 0.5 * (inside == 0).float()).sum()


class DiffusionDPORecipe(TrainRecipe):
    """Diffusion-DPO of ``family``'s denoiser (LoRA adapters; the reference: the adapters off) on
    the preference pairs ``data`` (a :class:`~mmcore.data.shards.ShardDataset` preprocessed with
    ``data.ranking``)."""

    loss_unit = "pairs"
    method = "dpo"
    sample_seeds = True  # 2 ranks draw what 1 does

    def __init__(self, family: "DiffusionFamily", ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> None:
        super().__init__()
        cfg = ctx.config.training
        if not data.index.get("ranking"):
            raise StageError("training.method=dpo trains on preference pairs: preprocess them with data.ranking: true (a caption with chosen and rejected videos)")
        if cfg.lora.r == 0 or cfg.lora.modules_to_save:
            raise StageError(
                "Diffusion-DPO's reference is the base with the LoRA adapters off (it must see the policy's noise, so it cannot be computed ahead): set training.lora.r > 0, without modules_to_save"
            )
        if cfg.dpo.reference == "precomputed":
            raise StageError("training.dpo.reference=precomputed: Diffusion-DPO's reference needs each step's noise; use auto or adapters_off (with LoRA)")
        self.family = family
        self.cfg = cfg
        self.beta = cfg.dpo.beta
        self.model_dir: Path = upstream["download"].output("model")
        self.train = data.split("train")
        train, held = family.samples(ctx, upstream, self.train), family.samples(ctx, upstream, data.split("eval"))
        self.train_samples, self.empty_text, self.encoders = train
        self.held_samples, _, self.held_encoders = held
        self.device = ctx.accelerator.device(ctx.world.local_rank)
        self.objective = family.objective(self.model_dir)
        self.predict = family.predictor(ctx, self.model_dir)
        self.sums: dict[str, Any] = {}
        self.freeze_groups = family.freeze_groups
        self.step_flops = (family.flops or denoiser_flops)()

    # -- the model and the data, as in SFT -----------------------------------------------------

    def build_model(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        return self.family.build_model(upstream["download"].output("model"))  # the family's denoiser (DPO trains no expert)

    def weights(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Path:
        return upstream["convert"].output("checkpoint")

    def shard_modules(self, model: Any) -> list[Any]:
        return blocks_at(model, self.family.shard_layers)

    def flops(self, model: Any, batch: dict[str, Any]) -> float:
        return self.step_flops(model, batch)

    def dataset(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Sequence[Any]:
        return self.train_samples

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        return collate(samples)

    def group_of(self, index: int) -> Any:
        return tuple(self.train.meta(index)["bucket"])  # latents of one micro-batch must stack

    # -- the loss ----------------------------------------------------------------------------

    def pair(self, batch: dict[str, Any], encoders: Any) -> tuple[Any, Any, Any]:
        """(chosen latents, rejected latents, text) of the batch on the device (encoded first
        with live ``encoders``)."""
        encode(batch, encoders)
        return batch["latents"].to(self.device), batch["rejected_latents"].to(self.device), batch["text"].to(self.device)

    def loss(self, model: Any, batch: dict[str, Any]) -> Any:
        """The pairs' summed loss (:func:`diffusion_dpo_terms`), each pair's caption dropout,
        noise level and noise from its ``sample_seeds``; the implicit accuracy summed aside."""
        import torch

        cfg, device = self.cfg, self.device
        winners, losers, text = self.pair(batch, self.encoders)
        generators = [torch.Generator().manual_seed(int(seed)) for seed in batch["sample_seeds"]]
        drop = torch.cat([torch.rand(1, generator=g) for g in generators]) < cfg.caption_dropout
        text = torch.where(drop.view(-1, *[1] * (text.dim() - 1)).to(device), self.empty_text.to(device).expand_as(text), text)
        levels = torch.cat([self.objective.draw(1, cfg, g) for g in generators]).to(device)
        noise = torch.stack([torch.randn(winners.shape[1:], generator=g) for g in generators]).to(device)
        losses, inside = diffusion_dpo_terms(self.objective, self.predict, model, winners, losers, text, levels, noise, self.beta)
        self.sums["implicit_accuracy"] = self.sums.get("implicit_accuracy", 0) + accuracy_sum(inside)
        return losses.sum()

    def step_metrics(self) -> dict[str, Any]:
        """The step's summed implicit accuracy (then reset)."""
        out = dict(self.sums)
        self.sums.clear()
        return out

    def evaluate(self, ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """Implicit accuracy on the held-out pairs at fixed noise levels and noise."""
        import torch

        if not len(self.held_samples):
            return {}
        right = 0.0
        count = min(len(self.held_samples), 256)
        for i in range(count):
            batch = collate([self.held_samples[i]])
            winners, losers, text = self.pair(batch, self.held_encoders)
            generator = torch.Generator().manual_seed(ctx.seed * 100_003 + i)
            levels = self.objective.eval_levels().to(self.device)
            n = len(levels)
            noise = torch.randn((n, *winners.shape[1:]), generator=generator).to(self.device)
            _, inside = diffusion_dpo_terms(
                self.objective, self.predict, model, winners.expand(n, *winners.shape[1:]), losers.expand(n, *losers.shape[1:]), text.expand(n, *text.shape[1:]), levels, noise, self.beta
            )
            right += float(accuracy_sum(inside.sum(0, keepdim=True)))
        return {"implicit_accuracy": right / count}


def dpo_recipe(family: "DiffusionFamily", ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> DiffusionDPORecipe:
    """The :class:`DiffusionDPORecipe` (what ``DiffusionFamily.recipe`` gives for ``training.method: dpo``)."""
    return DiffusionDPORecipe(family, ctx, upstream, data)


__all__ = ["DiffusionDPORecipe", "dpo_recipe", "diffusion_dpo_terms", "accuracy_sum", "TIMESTEPS"]
