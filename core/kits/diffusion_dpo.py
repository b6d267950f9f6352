"""Diffusion-DPO for the diffusion kit (Wallace et al. 2023), on the family's objective.

A pair is one caption with a preferred (w) and a dispreferred (l) video, from the feature cache
(or encoded per batch). Both get the same noise level and the same noise; with ``e`` the
objective's error per element, averaged over the latent (flow matching: ``|| v_hat - (noise -
x) ||^2``, as in :func:`mmcore.kits.diffusion.diffusion_loss`), the per-pair loss is

    -log sigmoid( -(beta * T / 2) * ((e_w - e_w_ref) - (e_l - e_l_ref)) ),   T = 1000

the paper's form with its ``beta * T`` (T: the 1000 timesteps the paper's models discretise; its
Stable Diffusion 1.5 setting ``beta_T = 5000`` is ``training.dpo.beta: 5``) and its 1/2 (as in
diffusers' reference script). The reference is the frozen base: the LoRA adapters switched off
(a reference needs the same noise as the policy, so it cannot be computed once ahead), hence
Diffusion-DPO trains LoRA adapters. The implicit accuracy is the share of pairs where the
argument above is positive (a tie, as at the start, counts half). Each pair's caption dropout,
noise level and noise come from its own seed (``TrainRecipe.sample_seeds``), as in SFT.

Held-out pairs (``data.eval_fraction``) are measured at the objective's fixed noise levels
(:data:`mmcore.kits.diffusion.EVAL_SIGMAS`) with fixed noise (drawn from ``run.seed`` and the pair's index), without
caption dropout, the sigmoid's arguments summed over the levels: the figure moves only with the
weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.diffusion import DiffusionFamily

TIMESTEPS = 1000


def diffusion_dpo_terms(objective: Any, predict: Any, model: Any, winners: Any, losers: Any, text: Any, levels: Any, noise: Any, beta: float) -> tuple[Any, Any]:
    """(per-pair loss, per-pair argument of the sigmoid): policy errors with gradients, the
    reference's with the adapters off and without; ``objective`` as the family's
    (:class:`mmcore.kits.diffusion.FlowMatching`, ``NoiseSchedule``)."""
    import torch
    import torch.nn.functional as F

    from mmcore.lora import adapters_disabled

    pairs = winners.shape[0]
    both = torch.cat([winners, losers])
    twice = lambda t: torch.cat([t, t])  # noqa: E731 - the same caption, noise level and noise for w and l
    errors = objective.errors(predict, model, both, twice(noise), twice(levels), twice(text))
    with torch.no_grad(), adapters_disabled(model):
        ref = objective.errors(predict, model, both, twice(noise), twice(levels), twice(text))
    inside = -0.5 * beta * TIMESTEPS * ((errors[:pairs] - ref[:pairs]) - (errors[pairs:] - ref[pairs:]))
    return -F.logsigmoid(inside), inside.detach()


def accuracy_sum(inside: Any) -> Any:
    return ((inside > 0).float() + 0.5 * (inside == 0).float()).sum()


def dpo_recipe(family: "DiffusionFamily", ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> Any:
    import torch

    from mmcore.kits import blocks_at
    from mmcore.kits.diffusion import collate, denoiser_flops
    from mmcore.train import TrainRecipe

    cfg = ctx.config.training
    if not data.index.get("ranking"):
        raise StageError("training.method=dpo trains on preference pairs: preprocess them with data.ranking: true (a caption with chosen and rejected videos)")
    if cfg.lora.r == 0 or cfg.lora.modules_to_save:
        raise StageError("Diffusion-DPO's reference is the base with the LoRA adapters off (it must see the policy's noise, so it cannot be computed ahead): set training.lora.r > 0, without modules_to_save")
    if cfg.dpo.reference == "precomputed":
        raise StageError("training.dpo.reference=precomputed: Diffusion-DPO's reference needs each step's noise; use auto or adapters_off (with LoRA)")
    beta = cfg.dpo.beta
    train_split = data.split("train")
    train, held = family.samples(ctx, upstream, train_split), family.samples(ctx, upstream, data.split("eval"))
    samples, empty, encoders = train
    device = ctx.accelerator.device(ctx.world.local_rank)
    objective = family.objective(upstream["download"].output("model"))
    predict = family.predictor(ctx, upstream["download"].output("model"))
    sums: dict[str, Any] = {}

    def encoded(batch: dict[str, Any], encoders: Any) -> tuple[Any, Any, Any]:
        if encoders is not None:  # in place: the step's FLOPs read the latents' shape
            batch.update(latents=torch.stack([encoders.latents(f) for f in batch["frames"]]),
                         rejected_latents=torch.stack([encoders.latents(f) for f in batch["rejected_frames"]]),
                         text=torch.stack([encoders.text(c) for c in batch["captions"]]))
        return batch["latents"].to(device), batch["rejected_latents"].to(device), batch["text"].to(device)

    def loss(model: Any, batch: dict[str, Any]) -> Any:
        winners, losers, text = encoded(batch, encoders)
        generators = [torch.Generator().manual_seed(int(seed)) for seed in batch["sample_seeds"]]
        drop = torch.cat([torch.rand(1, generator=g) for g in generators]) < cfg.caption_dropout
        text = torch.where(drop.view(-1, *[1] * (text.dim() - 1)).to(device), empty.to(device).expand_as(text), text)
        levels = torch.cat([objective.draw(1, cfg, g) for g in generators]).to(device)
        noise = torch.stack([torch.randn(winners.shape[1:], generator=g) for g in generators]).to(device)
        losses, inside = diffusion_dpo_terms(objective, predict, model, winners, losers, text, levels, noise, beta)
        sums["implicit_accuracy"] = sums.get("implicit_accuracy", 0) + accuracy_sum(inside)
        return losses.sum()

    def step_metrics() -> dict[str, Any]:
        out = dict(sums)
        sums.clear()
        return out

    def evaluate(ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """Implicit accuracy on the held-out pairs at fixed noise levels and noise."""
        held_samples, _, held_encoders = held
        if not len(held_samples):
            return {}
        right = 0.0
        count = min(len(held_samples), 256)
        for i in range(count):
            batch = collate([held_samples[i]])
            winners, losers, text = encoded(batch, held_encoders)
            generator = torch.Generator().manual_seed(ctx.seed * 100_003 + i)
            levels = objective.eval_levels().to(device)
            n = len(levels)
            noise = torch.randn((n, *winners.shape[1:]), generator=generator).to(device)
            _, inside = diffusion_dpo_terms(objective, predict, model, winners.expand(n, *winners.shape[1:]), losers.expand(n, *losers.shape[1:]),
                                            text.expand(n, *text.shape[1:]), levels, noise, beta)
            right += float(accuracy_sum(inside.sum(0, keepdim=True)))
        return {"implicit_accuracy": right / count}

    return TrainRecipe(
        build_model=lambda ctx, upstream: family.build_model(upstream["download"].output("model")),
        weights=lambda ctx, upstream: upstream["convert"].output("checkpoint"),
        flops=(family.flops or denoiser_flops)(),
        dataset=lambda ctx, upstream: samples,
        collate=collate,
        loss=loss,
        shard_modules=lambda model: blocks_at(model, family.shard_layers),
        freeze_groups=family.freeze_groups,
        loss_unit="pairs",
        group_of=lambda i: tuple(train_split.meta(i)["bucket"]),  # latents of one micro-batch must stack
        evaluate=evaluate,
        step_metrics=step_metrics,
        sample_seeds=True,  # 2 ranks draw what 1 does
    )


__all__ = ["dpo_recipe", "diffusion_dpo_terms", "TIMESTEPS"]
