"""Flow-GRPO / DanceGRPO for the diffusion kit (``training.method: grpo``): :class:`DiffusionGRPORecipe`,
online RL of a flow-matching denoiser on the captions of a captioned-image (or video) dataset.

* **Rollouts** (:meth:`DiffusionGRPORecipe.rollout`): on every rank, for each of its captions of
  the step, ``group_size`` samples from the model being trained: noise drawn from a seed of
  (``run.seed``, step, caption index), integrated from level 1 to 0 over ``sample_steps`` levels
  (shifted by ``training.flow_shift``) as the SDE of :mod:`mmcore.kits.diffusion.flow_grpo`
  (noise ``sde_noise_level``) with the denoiser called as the SFT loss calls it (the family's
  ``predict`` and options, FLUX's guidance embedding included; no classifier-free guidance),
  keeping every step's latent and log-probability. The last latent is decoded by the VAE
  (:func:`~mmcore.kits.diffusion.pipelines.vae_frames`) and scored by image rewards
  (:mod:`mmcore.train.image_rewards`, plugins' ``takes="image"``); advantages are normalised
  in each caption's group.
* **Update** (:meth:`DiffusionGRPORecipe.loss`): each sample trains on ``train_timesteps`` of
  its steps (a seeded draw: DanceGRPO's subsampling): the log-probability of the stored next
  latent under the current policy, the clipped ratio against the rollout's (with
  ``epochs`` > 1) and ``beta`` times the exact Gaussian KL to the reference's step
  (:func:`mmcore.train.grpo.grpo_terms`; a loss unit is one sample's step). The reference
  (:class:`~mmcore.backends.frozen.GrpoReference`: the base with the LoRA adapters off, or,
  fully fine-tuned, the weights of the first rollout) predicts its step's mean in the rollout,
  once for every update on it.
* **Metrics**: ``reward``, ``reward_std`` (within groups), ``rewards/<name>``, ``kl``,
  ``clip_fraction`` and the engine's ``rollout_share``; held out: the SFT recipe's error at fixed
  noise, plus deterministic ODE samples (fixed noise) of the first ``eval_prompts`` held-out
  captions and their mean reward (``reward``, ``rewards/<name>``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from mmcore.backends.frozen import GrpoReference
from mmcore.errors import StageError
from mmcore.framework.context import StageContext
from mmcore.kits.diffusion.batches import collate
from mmcore.kits.diffusion.objectives import FlowMatching
from mmcore.kits.diffusion.recipe import DiffusionRecipe
from mmcore.run.rundir import Manifest
from mmcore.train.rollouts import INDEX, IndexedSamples

if TYPE_CHECKING:
    from mmcore.kits.diffusion.family import DiffusionFamily


class DiffusionGRPORecipe(DiffusionRecipe):
    """The train engine's Flow-GRPO recipe of ``family``'s denoiser on the captions of ``data``."""

    method = "grpo"
    ulysses = False  # rollouts sample whole (parallel.ulysses: supervised fine-tuning)
    loss_unit = "timesteps"

    def __init__(self, family: "DiffusionFamily", ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> None:
        from mmcore.kits.diffusion.flow_grpo import schedule
        from mmcore.train.rewards import RewardSet

        super().__init__(family, ctx, upstream, data)
        cfg = self.cfg
        self.settings, self.seed = cfg.grpo, ctx.seed
        self._check(ctx)
        assert ctx.plugins is not None, "GRPO's rewards come from the registry"
        self.rewards = RewardSet(ctx.plugins.registry, self.settings.rewards, self.settings, takes="image")
        self.steps_per_rollout = self.settings.epochs
        self.levels = schedule(self.settings.sample_steps, cfg.flow_shift)
        self.cap = float(self.levels[1])  # sigma_t's guard at t = 1 (Flow-GRPO's)
        self.timesteps = self.settings.train_timesteps or self.settings.sample_steps
        self.live = self.encoders or family.encoders(self.model_dir, ctx.config.data.max_sequence_length)  # the VAE decodes every rollout
        self.device = ctx.accelerator.device(ctx.world.local_rank)
        self.texts: dict[str, Any] = {}
        self.shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.sums: dict[str, tuple[float, float]] = {}
        self.shown: dict[str, Any] = {}  # the rollout's first group, for rollouts.jsonl
        self.updates = 1  # loss calls by this process, counted for the crash tests' kill point
        self.reference = GrpoReference(bool(cfg.lora.r), ctx.stage_dir, ctx.world)

    def _check(self, ctx: StageContext) -> None:
        from mmcore.train.rollouts import check_rollout_window

        cfg, settings = self.cfg, self.settings
        if ctx.config.parallel.backend != "fsdp2":
            raise StageError(f"training.method=grpo runs on parallel.backend: fsdp2 (not {ctx.config.parallel.backend} yet)")
        if not isinstance(self.objective, FlowMatching) or self.objective.within != (0.0, 1.0):
            raise StageError("training.method=grpo in the diffusion kit samples a flow-matching denoiser over all noise levels: not a DDPM-schedule family, nor one expert of two (training.expert)")
        if self.family.conditions:
            raise StageError(f"training.method=grpo: Flow-GRPO of a family conditioned on {', '.join(self.family.conditions)} is not supported yet")
        if settings.sde_noise_level <= 0:
            raise StageError("training.grpo.sde_noise_level must be > 0: the ODE's steps are not random and have no log-probability to learn from")
        if settings.train_timesteps > settings.sample_steps:
            raise StageError(f"training.grpo.train_timesteps ({settings.train_timesteps}) exceeds training.grpo.sample_steps ({settings.sample_steps})")
        answer_only = [k for k in ("entropy_coef", "skip_uniform_groups", "top_k") if getattr(settings, k)]
        if answer_only:
            raise StageError(f"training.grpo.{answer_only[0]} is the VLM kit's (sampled answers' tokens); the diffusion kit has none: leave it unset")
        check_rollout_window(cfg)

    # -- the data: the SFT batch (for warm-up steps), with each caption's index ---------------

    def dataset(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        return IndexedSamples(self.train_samples)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        batch = collate([{k: v for k, v in s.items() if k != INDEX} for s in samples])
        batch[INDEX] = [s[INDEX] for s in samples]
        return batch

    def text_of(self, caption: str) -> Any:
        """A caption's features from the live text encoder, each caption encoded once."""
        if caption not in self.texts:
            self.texts[caption] = self.live.text(caption)
        return self.texts[caption]

    def latent_shape(self, frames: Any) -> tuple[int, ...]:
        """The latent shape of clips shaped like ``frames`` (uint8 [F, H, W, 3]): what the VAE makes
        of black frames of that size, once per size."""
        import torch

        key = tuple(frames.shape)
        if key not in self.shapes:
            self.shapes[key] = tuple(self.live.latents(torch.zeros(key, dtype=torch.uint8)).shape)
        return self.shapes[key]

    def decode(self, latents: Any) -> Any:
        """Latents [B, ...] -> frames float [B, F, H, W, 3] in [0, 1]: the family's encoders'
        ``frames`` where they have it, else the pipeline's VAE (``encoders.pipe.vae``)."""
        from mmcore.kits.diffusion.pipelines import vae_frames

        own = getattr(self.live, "frames", None)
        return own(latents.cpu()) if own is not None else vae_frames(self.live.pipe.vae, latents.cpu())

    def sample(self, model: Any, text: Any, noise: Any, noise_level: float, generator: Any = None) -> tuple[Any, Any]:
        """(latents at every level [B, steps + 1, ...], each step's log-probability [B, steps]) of
        samples from ``noise`` [B, ...] for caption features ``text`` [B, ...]."""
        from mmcore.kits.diffusion.flow_grpo import sample_sde
        from mmcore.kits.diffusion.objectives import _generated

        text = text.to(self.device)
        velocity = lambda x, t: _generated(self.predict(model, x, t.to(self.device), text))[0]  # noqa: E731
        return sample_sde(velocity, noise.to(self.device), self.levels, noise_level, generator)

    # -- the rollout ---------------------------------------------------------------------------

    def rollout(self, ctx: StageContext, model: Any, micro: list[dict[str, Any]], step: int) -> list[dict[str, Any]] | None:
        """The samples of the step's captions, scored, as rows of chosen steps (None in the warm-up)."""
        if step < self.settings.warmup_sft_steps:
            return None
        import torch

        from mmcore.framework.faults import crash_point
        from mmcore.train.loop import sample_seed

        group, out = self.settings.group_size, []
        for batch in micro:
            captions = list(batch["captions"]) if "captions" in batch else [self.train.meta(i)["caption"] for i in batch[INDEX]]
            shape = tuple(batch["latents"].shape[1:]) if "latents" in batch else self.latent_shape(batch["frames"][0])
            texts = batch["text"] if "text" in batch else torch.stack([self.text_of(c) for c in captions])
            groups = []
            for caption, index, text in zip(captions, batch[INDEX], texts):
                generator = torch.Generator().manual_seed(sample_seed(self.seed, step, 0, index))
                noise = torch.randn((group, *shape), generator=generator)
                latents, logps = self.sample(model, text.expand(group, *text.shape), noise, self.settings.sde_noise_level, generator)
                chosen = torch.stack([torch.randperm(self.settings.sample_steps, generator=generator)[: self.timesteps].sort().values for _ in range(group)])
                groups.append((latents.cpu(), logps.cpu(), chosen, text))
            crash_point("grpo-rollout", step + 1)  # the crash tests' kill point: samples drawn, the step not trained
            out.append(self.rows(model, groups, captions, first=step == self.settings.warmup_sft_steps))
        if ctx.world.is_main and self.shown:
            import json

            with open(ctx.stage_dir / "rollouts.jsonl", "a", encoding="utf-8") as log:
                log.write(json.dumps({"step": step + 1, **self.shown}) + "\n")
            self.shown = {}
        return out

    def rows(self, model: Any, groups: list[tuple[Any, Any, Any, Any]], captions: list[str], first: bool) -> dict[str, Any]:
        """One row per sample: its chosen steps' latents and levels, the rollout's log-probabilities,
        its caption's features and its advantage (and, with ``beta``, the reference's step means);
        the rewards measured. ``first``: the first rollout (full fine-tuning's reference)."""
        import torch

        from mmcore.train.grpo import group_advantages

        settings, size = self.settings, self.settings.group_size
        latents = torch.cat([g[0] for g in groups])  # [R, steps + 1, ...]
        logps, chosen = torch.cat([g[1] for g in groups]), torch.cat([g[2] for g in groups])  # [R, steps], [R, K]
        frames = self.decode(latents[:, -1])
        prompts = [c for c in captions for _ in range(size)]
        totals, each = self.rewards.score_images([f.numpy() for f in frames], prompts)
        if not self.shown:
            self.shown = {"caption": captions[0], "rewards": totals[:size]}
        rewards = torch.tensor(totals, dtype=torch.float32)
        rows = torch.arange(len(latents)).unsqueeze(1)
        levels = self.levels.float()
        batch = {
            "x": latents[rows, chosen],
            "x_next": latents[rows, chosen + 1],
            "t": levels[chosen],
            "t_next": levels[chosen + 1],
            "text": torch.stack([g[3] for g in groups]).repeat_interleave(size, dim=0),
            "advantages": group_advantages(rewards, size, scale=settings.scale_rewards),
            "num_loss_tokens": int(chosen.numel()),
        }
        if settings.epochs > 1:  # later steps on this rollout clip the ratio to the sampling policy
            batch["old_logps"] = logps.gather(1, chosen)
        if settings.beta > 0:  # the reference's step from each chosen latent: fixed by the rollout
            with self.reference.of(model, first):
                ref_mean, _ = self.step_mean_std(model, batch)
            batch["ref_mean"] = ref_mean.view(batch["x"].shape).cpu()
        n = float(len(rewards))
        grouped = rewards.view(-1, size)
        self.add("reward", float(rewards.sum()), n)
        self.add("reward_std", float(grouped.std(dim=1).sum()), float(grouped.shape[0]))
        for name, values in each.items():
            self.add(f"rewards/{name}", sum(values), n)
        return batch

    # -- the loss ------------------------------------------------------------------------------

    def loss(self, model: Any, batch: dict[str, Any]) -> Any:
        """The GRPO loss of the rows' chosen steps (:func:`mmcore.train.grpo.grpo_terms`); a
        warm-up step's batch: the SFT loss."""
        if "advantages" not in batch:
            return super().loss(model, batch)
        import torch

        from mmcore.framework.faults import crash_point
        from mmcore.kits.diffusion.flow_grpo import gaussian_kl, log_prob
        from mmcore.train.grpo import grpo_terms

        settings, device = self.settings, self.device
        rows, steps = batch["t"].shape
        mean, std = self.step_mean_std(model, batch)
        logps = log_prob(batch["x_next"].flatten(0, 1).to(device), mean, std).view(rows, steps)
        kl = None
        if settings.beta > 0:
            kl = gaussian_kl(mean, batch["ref_mean"].flatten(0, 1).to(device), std).view(rows, steps)
        old = batch.get("old_logps")
        terms = grpo_terms(
            logps,
            torch.ones_like(logps),
            batch["advantages"].to(device),
            old_logps=old.to(device) if old is not None else None,
            kl=kl,
            epsilon=settings.epsilon,
            beta=settings.beta,
        )
        crash_point("grpo-update", self.updates)  # the crash tests' kill point: in an update's forward
        self.updates += 1
        self.add("kl", float(terms.kl_sum), float(terms.tokens))
        self.add("clip_fraction", float(terms.clipped_sum), float(terms.tokens))
        return terms.loss_sum

    def step_mean_std(self, model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        """The SDE step's mean and std from each of the rows' chosen latents under ``model``
        (flattened: [rows * steps, ...])."""
        from mmcore.kits.diffusion.flow_grpo import sde_step
        from mmcore.kits.diffusion.objectives import _generated

        device, steps = self.device, batch["t"].shape[1]
        x, t, t_next = batch["x"].flatten(0, 1).to(device), batch["t"].flatten().to(device), batch["t_next"].flatten().to(device)
        v = _generated(self.predict(model, x, t, batch["text"].to(device).repeat_interleave(steps, dim=0)))[0]
        return sde_step(x.float(), v.float(), t, t_next, self.settings.sde_noise_level, self.cap)

    def flops(self, model: Any, batch: dict[str, Any]) -> float:
        """The denoiser's forward and backward on the rows' chosen steps (the rollout's and the
        reference's forwards are not counted)."""
        if "advantages" not in batch:
            return super().flops(model, batch)
        return self.step_flops(model, {"latents": batch["x"].flatten(0, 1), "text": batch["text"]})

    def add(self, name: str, total: float, count: float) -> None:
        old = self.sums.get(name, (0.0, 0.0))
        self.sums[name] = (old[0] + total, old[1] + count)

    def step_metrics(self) -> dict[str, Any]:
        sums, self.sums = self.sums, {}
        return sums

    # -- held out ------------------------------------------------------------------------------

    def evaluate(self, ctx: StageContext, model: Any, step: int) -> dict[str, float]:
        """The SFT recipe's held-out errors, and the mean reward (``reward``, ``rewards/<name>``)
        of ``eval_prompts`` deterministic samples (the ODE, noise fixed per sample) of the held-out
        captions, cycling over them with new noise where there are fewer: comparable across
        steps and runs."""
        import torch

        metrics = super().evaluate(ctx, model, step)
        held = len(self.held)
        count = self.settings.eval_prompts if held else 0
        if not count:
            return metrics
        by_shape: dict[tuple[int, ...], list[int]] = {}
        shapes = {}
        for k in range(min(count, held)):
            item = self.held_samples[k]
            shapes[k] = tuple(item["latents"].shape) if "latents" in item else self.latent_shape(item["frames"])
        for i in range(count):  # sample i: held-out caption i % held, its own noise
            by_shape.setdefault(shapes[i % held], []).append(i)
        captions = [self.held.meta(i % held)["caption"] for i in range(count)]
        totals: list[float] = []
        each: dict[str, list[float]] = {}
        for shape, chosen in by_shape.items():
            noise = torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(ctx.seed * 100_003 + i)) for i in chosen])
            text = torch.stack([self.text_of(captions[i]) for i in chosen])
            latents, _ = self.sample(model, text, noise, 0.0)
            scored, named = self.rewards.score_images([f.numpy() for f in self.decode(latents[:, -1])], [captions[i] for i in chosen])
            totals += scored
            for name, values in named.items():
                each.setdefault(name, []).extend(values)
        metrics["reward"] = sum(totals) / count
        metrics.update({f"rewards/{name}": sum(values) / count for name, values in each.items()})
        return metrics


def grpo_recipe(family: "DiffusionFamily", ctx: StageContext, upstream: Mapping[str, Manifest], data: Any) -> DiffusionGRPORecipe:
    """The :class:`DiffusionGRPORecipe` (what ``DiffusionFamily.recipe`` gives for ``training.method: grpo``)."""
    return DiffusionGRPORecipe(family, ctx, upstream, data)


__all__ = ["DiffusionGRPORecipe", "grpo_recipe"]
