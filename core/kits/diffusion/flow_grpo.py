"""Flow-GRPO / DanceGRPO's sampler (Liu et al. 2025; Xue et al. 2025): a rectified flow's ODE
sampled as an SDE with the same marginals, so each denoising step is a Gaussian transition
whose log-probability the policy ratio of GRPO needs.

The kit's convention (:class:`~mmcore.kits.diffusion.objectives.FlowMatching`): at noise level
``t`` (1 = pure noise) ``x_t = (1 - t) x0 + t n`` and the denoiser predicts ``v = n - x0``, so
``x0 = x_t - t v``, ``n = x_t + (1 - t) v`` and the score is ``-(x_t + (1 - t) v) / t``. The
reverse-time SDE ``dx = [v - sigma_t^2 / 2 * score] dt + sigma_t dw``, stepped from ``t`` down to
``t - dt`` (``dt`` > 0) by Euler-Maruyama, is the Gaussian::

    mean = x_t - dt * [v + sigma_t^2 / (2 t) * (x_t + (1 - t) v)]
    std  = sigma_t * sqrt(dt),      sigma_t = a * sqrt(t / (1 - t))

with ``a`` = ``training.grpo.sde_noise_level`` (``a`` = 0 is the ODE's Euler step). At ``t`` = 1
``1 - t`` is 0: as Flow-GRPO does, the denominator takes ``1 - cap`` there (``cap``: the
schedule's second level). A step's **log-probability** is the Gaussian log density of the next
latent, **averaged over the latent's elements** (Flow-GRPO's choice: the ratio's scale does
not grow with the picture's size; the clip range means the same at 32 x 32 as at 1024 x 1024);
the KL to the reference is the exact KL of two such Gaussians with the same std, averaged alike:
``mean((mean - mean_ref)^2) / (2 std^2)``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def schedule(steps: int, shift: float = 1.0) -> "torch.Tensor":
    """``steps + 1`` noise levels from 1 to 0: uniform, then shifted as flow-matching schedulers
    shift them (``shift * u / (1 + (shift - 1) * u)``), float64."""
    import torch

    u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return shift * u / (1 + (shift - 1) * u)


def _per_sample(x: "torch.Tensor", t: Any) -> "torch.Tensor":
    """A level (scalar or one per sample) broadcastable against ``x`` [B, ...]."""
    import torch

    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    return t.view(-1, *[1] * (x.dim() - 1)) if t.dim() else t


def sde_noise(t: Any, noise_level: float, cap: float) -> Any:
    """``sigma_t = a * sqrt(t / (1 - min(t, cap)))`` (the guard at ``t`` = 1)."""
    import torch

    t = torch.as_tensor(t)
    return noise_level * torch.sqrt(t / (1 - torch.clamp(t, max=cap)))


def sde_step(x: "torch.Tensor", v: "torch.Tensor", t: Any, t_next: Any, noise_level: float, cap: float) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(mean, std) of the next latent at ``t_next`` < ``t`` given ``x`` at ``t`` and the predicted
    velocity ``v``; ``t``/``t_next`` scalars or one per sample. Computed in ``x``'s dtype."""
    t_, dt = _per_sample(x, t), _per_sample(x, t) - _per_sample(x, t_next)
    sigma = sde_noise(t_, noise_level, cap)
    v = v.to(x.dtype)
    mean = x - dt * (v + sigma**2 / (2 * t_) * (x + (1 - t_) * v))
    return mean, sigma * dt.sqrt()


def log_prob(sample: "torch.Tensor", mean: "torch.Tensor", std: "torch.Tensor") -> "torch.Tensor":
    """The Gaussian log density of ``sample`` under ``N(mean, std^2)``, per sample: the mean over
    its elements (see the module's docstring) [B]."""
    dims = tuple(range(1, sample.dim()))
    std = std.expand_as(mean)
    return (-((sample.to(mean.dtype) - mean) ** 2) / (2 * std**2) - std.log() - LOG_SQRT_2PI).mean(dim=dims)


def gaussian_kl(mean: "torch.Tensor", ref_mean: "torch.Tensor", std: "torch.Tensor") -> "torch.Tensor":
    """KL(N(mean, std^2) || N(ref_mean, std^2)) per sample, averaged over the elements [B]."""
    dims = tuple(range(1, mean.dim()))
    return ((mean - ref_mean.to(mean.dtype)) ** 2 / (2 * std.expand_as(mean) ** 2)).mean(dim=dims)


def sample_sde(velocity: Any, noise: "torch.Tensor", levels: "torch.Tensor", noise_level: float, generator: Any = None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Integrate from ``noise`` (at ``levels[0]`` = 1) to ``levels[-1]`` = 0 with :func:`sde_step`:
    ``velocity(x, t)`` gives ``v`` for latents ``x`` [B, ...] at level ``t`` [B]. Returns (every
    latent [B, steps + 1, ...], the log-probability of each step's next latent [B, steps]); the
    step noise is drawn from ``generator`` (``noise_level`` 0: the deterministic Euler ODE)."""
    import torch

    x, steps = noise.float(), len(levels) - 1
    cap = float(levels[1]) if steps > 1 else 0.0
    levels = levels.float().to(x.device)  # the levels the update recomputes the steps at
    latents, logps = [x], []
    for i in range(steps):
        t, t_next = levels[i], levels[i + 1]
        v = velocity(x, t.expand(x.shape[0]))
        mean, std = sde_step(x, v.float(), t, t_next, noise_level, cap)
        if noise_level > 0:
            eps = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.device)
            x = mean + std * eps
            logps.append(log_prob(x, mean, std))
        else:
            x = mean
            logps.append(torch.zeros(x.shape[0], device=x.device))
        latents.append(x)
    return torch.stack(latents, dim=1), torch.stack(logps, dim=1)


__all__ = ["schedule", "sde_noise", "sde_step", "log_prob", "gaussian_kl", "sample_sde", "LOG_SQRT_2PI"]
