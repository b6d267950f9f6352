"""What the diffusion kit trains a denoiser to do: its objectives and their loss.

:class:`FlowMatching` (rectified flow: the velocity ``noise - data`` regressed at noise levels
drawn by :func:`sigmas`) or :class:`NoiseSchedule` (a DDPM-family scheduler's v or epsilon
prediction); :func:`diffusion_loss` draws each sample's caption dropout, noise level and noise
and sums the objective's errors. Held-out clips are measured at :data:`EVAL_SIGMAS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from mmcore.errors import StageError
from mmcore.kits.diffusion.latents import batch_size, device_of, is_named, per_sample_error, stack, tree_map


#: the noise levels a held-out clip is measured at (one fixed noise draw each)
EVAL_SIGMAS = (0.2, 0.4, 0.6, 0.8)


def sigmas(batch: int, cfg: Any, generator: Any = None, within: tuple[float, float] = (0.0, 1.0)) -> Any:
    """Noise levels in (0, 1): uniform or logit-normal, then shifted as flow-matching schedulers
    shift them. ``within``: only levels in [lo, hi) (one expert's), drawn from the same
    distribution cut to that range (its inverse CDF over the range's share)."""
    import torch

    shift = cfg.flow_shift
    if within != (0.0, 1.0):
        unshift = lambda s: s / (shift - (shift - 1) * s)  # noqa: E731 - the inverse of the shift below
        lo, hi = (torch.tensor(unshift(x), dtype=torch.float64) for x in within)
        if cfg.timestep_sampling == "logit_normal":
            cdf = lambda u: torch.special.ndtr(torch.logit(u))  # noqa: E731
            p = cdf(lo) + (cdf(hi) - cdf(lo)) * torch.rand(batch, generator=generator, dtype=torch.float64)
            u = torch.sigmoid(torch.special.ndtri(p)).float()
        else:
            u = (lo + (hi - lo) * torch.rand(batch, generator=generator, dtype=torch.float64)).float()
        return (shift * u / (1 + (shift - 1) * u)).clamp(within[0], within[1])
    u = torch.sigmoid(torch.randn(batch, generator=generator)) if cfg.timestep_sampling == "logit_normal" else torch.rand(batch, generator=generator)
    return shift * u / (1 + (shift - 1) * u)


def _per_sample(latents: Any) -> Any:
    return tuple(range(1, latents.dim()))


def _generated(output: Any) -> tuple[Any, Any]:
    """``predict``'s output as (prediction, mask of what the pipeline generates or None)."""
    return output if isinstance(output, tuple) else (output, None)


def _mean_error(squared: Any, generated: Any = None) -> Any:
    """Per-sample mean of ``squared``; with a ``generated`` mask (1 where the pipeline generates
    the latents, 0 where a condition gives them: Wan2.2 TI2V's first frame), over those only."""
    if generated is None:
        return squared.mean(dim=_per_sample(squared))
    generated = generated.to(squared.dtype).expand_as(squared)
    return (squared * generated).sum(dim=_per_sample(squared)) / generated.sum(dim=_per_sample(squared))


class FlowMatching:
    """Rectified flow (Wan, FLUX, HunyuanVideo): ``x_s = (1 - s) x + s n`` at a noise level
    ``s`` in (0, 1), the velocity ``n - x`` regressed; levels drawn uniform or logit-normal and
    shifted (``training.flow_shift``, ``training.timestep_sampling``). ``predict`` gets ``s``.
    ``within``: one expert's levels [lo, hi) only (drawn and held out there). Named latents
    (:mod:`~mmcore.kits.diffusion.latents`, LTX-2's video and audio) share the level; each
    name's squared error is averaged over its own elements and the names summed with
    ``weights`` (default 1 each)."""

    def __init__(self, within: tuple[float, float] = (0.0, 1.0), weights: Mapping[str, float] | None = None) -> None:
        self.within = within
        self.weights = dict(weights or {})

    def draw(self, batch: int, cfg: Any, generator: Any = None) -> Any:
        return sigmas(batch, cfg, generator, self.within)

    def eval_levels(self) -> Any:
        import torch

        lo, hi = self.within
        return torch.tensor([lo + (hi - lo) * s for s in EVAL_SIGMAS])

    def errors(self, predict: Callable[..., Any], model: Any, latents: Any, noise: Any, levels: Any, text: Any) -> Any:
        """Per-sample mean squared error of the predicted velocity (named latents: per name, weighted)."""
        level = lambda x: levels.view(-1, *[1] * (x.dim() - 1))  # noqa: E731
        noisy = tree_map(lambda x, n: (1 - level(x)) * x + level(x) * n, latents, noise)
        prediction, generated = _generated(predict(model, noisy, levels, text))
        squared = tree_map(lambda p, x, n: (p.float() - (n - x).float()) ** 2, prediction, latents, noise)
        return per_sample_error(squared, self.weights, _mean_error, generated)


class NoiseSchedule:
    """A diffusers DDPM-family scheduler's discrete schedule (CogVideoX: ``CogVideoXDDIMScheduler``,
    v-prediction with zero terminal SNR), trained as the model's own trainers train it:
    timesteps uniform in [0, T), ``x_t = scheduler.add_noise(x, n, t)``; for ``v_prediction`` the
    model's output is turned into its estimate of ``x`` (``scheduler.get_velocity(output, x_t,
    t)``) and the squared error weighted by ``1 / (1 - alphas_cumprod[t])`` (which equals the
    squared error of the velocity itself); for ``epsilon`` the noise is regressed. ``predict``
    gets the integer timesteps. Held-out levels: ``EVAL_SIGMAS`` x T."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.steps = int(scheduler.config.num_train_timesteps)
        self.prediction_type = scheduler.config.prediction_type
        if self.prediction_type not in ("v_prediction", "epsilon"):
            raise StageError(f"scheduler prediction_type {self.prediction_type!r}: the diffusion kit trains v_prediction and epsilon")

    @classmethod
    def of(cls, model_dir: Path) -> "NoiseSchedule":
        """The schedule of the pipeline folder's ``scheduler/`` (its class as its config names it)."""
        import json

        import diffusers

        folder = model_dir / "scheduler"
        name = json.loads((folder / "scheduler_config.json").read_text()).get("_class_name", "")
        if not hasattr(diffusers, name):
            raise StageError(f"{folder / 'scheduler_config.json'}: scheduler class {name!r} is not one diffusers has")
        return cls(getattr(diffusers, name).from_pretrained(folder))

    within = (0.0, 1.0)

    def draw(self, batch: int, cfg: Any, generator: Any = None) -> Any:
        import torch

        return torch.randint(0, self.steps, (batch,), generator=generator)

    def eval_levels(self) -> Any:
        import torch

        return torch.tensor([int(s * self.steps) for s in EVAL_SIGMAS])

    def errors(self, predict: Callable[..., Any], model: Any, latents: Any, noise: Any, levels: Any, text: Any) -> Any:
        if is_named(latents):
            raise StageError(f"named latents ({', '.join(sorted(latents))}) are trained by flow matching only, not a {self.prediction_type} noise schedule")
        noisy = self.scheduler.add_noise(latents, noise, levels)
        output, generated = _generated(predict(model, noisy, levels, text))
        output = output.float()
        if self.prediction_type == "epsilon":
            return _mean_error((output - noise.float()) ** 2, generated)
        estimate = self.scheduler.get_velocity(output, noisy.float(), levels)
        weights = (1 / (1 - self.scheduler.alphas_cumprod[levels.cpu()])).float().to(latents.device)  # the schedule is float64
        return _mean_error(weights.view(-1, *[1] * (latents.dim() - 1)) * (estimate - latents.float()) ** 2, generated)


#: the default objective of a family
FLOW_MATCHING = FlowMatching()


def flow_matching_objective(model_dir: Path) -> FlowMatching:
    """``DiffusionFamily.objective``'s default: :data:`FLOW_MATCHING`, whatever the checkpoint."""
    return FLOW_MATCHING


def diffusion_loss(objective: Any, predict: Callable[..., Any], model: Any, latents: Any, text: Any, empty_text: Any, cfg: Any, seeds: Any = None) -> Any:
    """Summed per-sample error of ``objective`` (:class:`FlowMatching`, :class:`NoiseSchedule`)
    at random noise levels, captions dropped with ``training.caption_dropout``.

    ``predict(model, noisy, level, text)`` is the family's call of its denoiser. ``seeds`` (one
    per sample, the engine's ``sample_seeds``): each sample's caption dropout, noise level and
    noise drawn from its own generator, so they do not depend on the micro-batch or rank it
    lands in; without, from torch's global generator.
    """
    import torch

    batch, device = batch_size(latents), device_of(latents)
    if seeds is None:
        drop = torch.rand(batch) < cfg.caption_dropout
        levels = objective.draw(batch, cfg)
        noise = tree_map(lambda x: torch.randn(x.shape), latents)
    else:
        generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        drop = torch.cat([torch.rand(1, generator=g) for g in generators]) < cfg.caption_dropout
        levels = torch.cat([objective.draw(1, cfg, g) for g in generators])
        # named latents: each sample's noise per name, in name order, from its one generator
        noise = stack([{name: torch.randn(latents[name].shape[1:], generator=g) for name in sorted(latents)} if is_named(latents) else torch.randn(latents.shape[1:], generator=g) for g in generators])
    text = torch.where(drop.view(-1, *[1] * (text.dim() - 1)).to(text.device), empty_text.to(text.device).expand_as(text), text)
    return objective.errors(predict, model, latents, tree_map(lambda n: n.to(device), noise), levels.to(device), text).sum()


def flow_matching_loss(predict: Callable[..., Any], model: Any, latents: Any, text: Any, empty_text: Any, cfg: Any, seeds: Any = None) -> Any:
    """:func:`diffusion_loss` of :class:`FlowMatching`: the velocity error (``noise - data``)."""
    return diffusion_loss(FLOW_MATCHING, predict, model, latents, text, empty_text, cfg, seeds)


__all__ = ["EVAL_SIGMAS", "sigmas", "FlowMatching", "NoiseSchedule", "FLOW_MATCHING", "flow_matching_objective", "diffusion_loss", "flow_matching_loss"]
