"""Flow-GRPO's parts without a model: the SDE step's Gaussian and its log-probabilities against a
direct float64 density, the step's signs against a flow whose marginals are known in closed form,
the loss and its gradients against the formula written out, the built-in image rewards and the
refusal of rewards of the other kind. (A whole run: packs/generative/flux/tests/test_flux_grpo.py.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mmcore.errors import StageError  # noqa: E402
from mmcore.framework.registry import Registry, RewardSpec  # noqa: E402
from mmcore.kits.diffusion.flow_grpo import gaussian_kl, log_prob, sample_sde, schedule, sde_noise, sde_step  # noqa: E402
from mmcore.train.grpo import grpo_terms  # noqa: E402
from mmcore.train.rewards import RewardSet  # noqa: E402


def direct_step(x: float, v: float, t: float, t_next: float, a: float, cap: float) -> tuple[float, float]:
    """The SDE's Euler-Maruyama step written out in Python floats."""
    sigma = a * math.sqrt(t / (1 - min(t, cap)))
    dt = t - t_next
    return x - dt * (v + sigma**2 / (2 * t) * (x + (1 - t) * v)), sigma * math.sqrt(dt)


def test_log_probabilities_are_the_steps_gaussian_densities_in_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 2, 2, generator=gen, dtype=torch.float64)
    v = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    t = torch.tensor([1.0, 0.6, 0.1], dtype=torch.float64)  # t = 1 takes the guard
    t_next = torch.tensor([0.9, 0.5, 0.0], dtype=torch.float64)
    mean, std = sde_step(x, v, t, t_next, 0.7, cap=0.9)
    sample = mean + std * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    got = log_prob(sample, mean, std)
    assert got.dtype == torch.float64 and got.shape == (3,)
    for i in range(3):
        m, s = direct_step(float(x[i, 0, 1, 1]), float(v[i, 0, 1, 1]), float(t[i]), float(t_next[i]), 0.7, 0.9)
        assert float(mean[i, 0, 1, 1]) == pytest.approx(m, rel=1e-14, abs=1e-15)
        assert float(std[i].flatten()[0]) == pytest.approx(s, rel=1e-14)
        # the Gaussian density of every element, averaged over the latent's elements
        density = torch.distributions.Normal(mean[i], std[i].expand_as(mean[i])).log_prob(sample[i]).mean()
        assert float(got[i]) == pytest.approx(float(density), rel=1e-13)
        by_hand = sum(-((a - b) ** 2) / (2 * s**2) - math.log(s) - 0.5 * math.log(2 * math.pi) for a, b in zip(sample[i].flatten().tolist(), mean[i].flatten().tolist())) / mean[i].numel()
        assert float(got[i]) == pytest.approx(by_hand, rel=1e-13)
    assert float(sde_noise(torch.tensor(1.0), 0.7, 0.9)) == pytest.approx(0.7 * math.sqrt(1 / 0.1))


@pytest.mark.parametrize("t", [0.9, 0.5, 0.2])
def test_the_sde_keeps_the_flows_marginals(t: float) -> None:
    """Data x0 ~ N(0, s^2), noise n ~ N(0, 1): x_t = (1 - t) x0 + t n has variance (1 - t)^2 s^2 + t^2
    and the exact velocity E[n - x0 | x_t] = x_t (t - (1 - t) s^2) / var_t. One small SDE step from
    the marginal at t lands on the marginal at t - dt up to O(dt^2); a wrong sign of the score
    term would miss by O(dt)."""
    s2, dt, a = 0.25, 1e-4, 0.7
    var = lambda u: (1 - u) ** 2 * s2 + u**2  # noqa: E731
    x = torch.tensor([1.0], dtype=torch.float64)  # the step is linear in x: mean = c x
    v = x * (t - (1 - t) * s2) / var(t)
    mean, std = sde_step(x, v, t, t - dt, a, cap=0.99)
    landed = float(mean) ** 2 * var(t) + float(std) ** 2
    assert landed == pytest.approx(var(t - dt), abs=2e-7)  # the wrong sign: off by >= 2e-5 here
    ode, _ = sde_step(x, v, t, t - dt, 0.0, cap=0.99)
    assert float(ode) ** 2 * var(t) == pytest.approx(var(t - dt), abs=2e-7)  # a = 0: the ODE's Euler step
    assert float(std) ** 2 > 1e-5  # and the SDE does add noise


def test_rollout_log_probabilities_equal_the_updates() -> None:
    """What :func:`sample_sde` keeps equals what the update recomputes from the stored latents
    (the same float32 levels, per-sample): the ratio of the first step on a rollout is exactly 1."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(4, 4, generator=gen) * 0.3
    velocity = lambda x, t: torch.einsum("ij,bjhw->bihw", weight, x) * (1 + t.view(-1, 1, 1, 1))  # noqa: E731
    levels = schedule(5, shift=3.0)
    latents, logps = sample_sde(velocity, torch.randn(2, 4, 3, 3, generator=gen), levels, 0.7, gen)
    assert latents.shape == (2, 6, 4, 3, 3) and logps.shape == (2, 5) and levels[0] == 1 and levels[-1] == 0
    cap, lv = float(levels[1]), levels.float()
    for k in range(5):
        t = lv[k].expand(2)
        mean, std = sde_step(latents[:, k], velocity(latents[:, k], t).float(), t, lv[k + 1].expand(2), 0.7, cap)
        assert torch.equal(log_prob(latents[:, k + 1], mean, std), logps[:, k])
    ode, zeros = sample_sde(velocity, latents[:, 0], levels, 0.0)
    assert not zeros.any() and not torch.equal(ode[:, -1], latents[:, -1])


def test_loss_and_gradients_equal_the_formula_in_float64() -> None:
    """The clipped objective on log-probabilities of SDE steps plus beta times the Gaussian KL, a
    linear velocity's weights differentiated: equal to the formula in Python floats, and its
    gradient to central differences of it."""
    gen = torch.Generator().manual_seed(2)
    rows, steps, eps, beta, a, cap = 4, 3, 0.2, 0.3, 0.7, 0.95
    x = torch.randn(rows * steps, 2, 2, 2, generator=gen, dtype=torch.float64)
    t = torch.rand(rows * steps, generator=gen, dtype=torch.float64) * 0.8 + 0.15
    t_next = t - 0.1
    x_next = torch.randn(x.shape, generator=gen, dtype=torch.float64) * 0.3 + 0.9 * x
    ref_w = torch.randn(2, 2, generator=gen, dtype=torch.float64)
    weights = (ref_w + 0.05 * torch.randn(2, 2, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 1.5, -2.0], dtype=torch.float64)

    def terms_of(w):  # type: ignore[no-untyped-def]
        mean, std = sde_step(x, torch.einsum("ij,bjhw->bihw", w, x), t, t_next, a, cap)
        ref_mean, _ = sde_step(x, torch.einsum("ij,bjhw->bihw", ref_w, x), t, t_next, a, cap)
        return log_prob(x_next, mean, std).view(rows, steps), gaussian_kl(mean, ref_mean, std).view(rows, steps)

    logps, kl = terms_of(weights)
    old = (logps.detach() + 0.4 * torch.randn(logps.shape, generator=gen, dtype=torch.float64)).detach()
    terms = grpo_terms(logps, torch.ones_like(logps), adv, old_logps=old, kl=kl, epsilon=eps, beta=beta)

    def direct(w):  # type: ignore[no-untyped-def]
        total = 0.0
        for r in range(rows):
            for k in range(steps):
                i = r * steps + k
                ti, tn = float(t[i]), float(t_next[i])
                lp, kl_i, n = 0.0, 0.0, x[i].numel()
                for c in range(2):
                    for h in range(2):
                        for col in range(2):
                            xs = [float(x[i, j, h, col]) for j in range(2)]
                            v = sum(float(w[c, j]) * xs[j] for j in range(2))
                            v_ref = sum(float(ref_w[c, j]) * xs[j] for j in range(2))
                            m, s = direct_step(xs[c], v, ti, tn, a, cap)
                            m_ref, _ = direct_step(xs[c], v_ref, ti, tn, a, cap)
                            lp += -((float(x_next[i, c, h, col]) - m) ** 2) / (2 * s**2) - math.log(s) - 0.5 * math.log(2 * math.pi)
                            kl_i += (m - m_ref) ** 2 / (2 * s**2)
                lp, kl_i = lp / n, kl_i / n
                ratio = math.exp(lp - float(old[r, k]))
                clipped = min(max(ratio, 1 - eps), 1 + eps)
                total += -min(ratio * float(adv[r]), clipped * float(adv[r])) + beta * kl_i
        return total

    assert terms.units == rows * steps
    assert float(terms.loss_sum.detach()) == pytest.approx(direct(weights.detach()), rel=1e-12)
    assert 0 < float(terms.clipped_sum) < rows * steps  # both branches taken
    assert float(terms.kl_sum) > 0
    terms.loss_sum.backward()
    for index in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        plus, minus = weights.detach().clone(), weights.detach().clone()
        plus[index] += 1e-6
        minus[index] -= 1e-6
        assert float(weights.grad[index]) == pytest.approx((direct(plus) - direct(minus)) / 2e-6, rel=1e-5, abs=1e-8)


def test_image_rewards() -> None:
    import numpy as np

    from mmcore.train.image_rewards import brightness, colour

    white = np.ones((1, 16, 16, 3), dtype=np.float32)
    red_square = white.copy()
    red_square[0, 4:12, 4:12] = np.array([220, 30, 30]) / 255
    half = red_square.copy()
    half[0, 4:8, 4:12] = np.array([40, 60, 220]) / 255  # the top half blue
    speck = white.copy()
    speck[0, 0, 0] = np.array([220, 30, 30]) / 255
    scores = colour([red_square, red_square, half, speck, white, red_square], ["a red square", "a blue square", "a red square", "a red circle", "a red circle", "a cat"])
    assert scores[:5] == [1.0, 0.0, 0.5, 1 / (0.01 * 256), 0.0] and scores[5] == 0.0
    assert brightness([white, np.zeros_like(white)], ["", ""]) == [1.0, 0.0]


def registry() -> Registry:
    reg = Registry()
    reg.add_reward(RewardSpec("accuracy", "mmcore.train.rewards:accuracy"), "test")
    reg.add_reward(RewardSpec("colour", "mmcore.train.image_rewards:colour", takes="image"), "test")
    reg.add_reward(RewardSpec("odd", "x:y", takes="audio"), "test")
    return reg


def test_a_reward_of_the_other_kind_is_refused_by_name() -> None:
    import numpy as np

    reg = registry()
    assert reg.errors == ["test: reward 'odd' takes='audio'; a reward takes one of text, image"]
    with pytest.raises(StageError, match=r"reward 'accuracy' scores texts, and this run's samples are images \(rewards on images: colour\)"):
        RewardSet(reg, {"accuracy": 1.0}, takes="image")
    with pytest.raises(StageError, match="reward 'colour' scores images, and this run's samples are texts"):
        RewardSet(reg, {"colour": 1.0})
    totals, each = RewardSet(reg, {"colour": 2.0}, takes="image").score_images([np.ones((1, 4, 4, 3), dtype=np.float32)], ["a red circle"])
    assert totals == [0.0] and each == {"colour": [0.0]}


@pytest.mark.parametrize("statistics", ["shift", "per_channel"])
def test_vae_frames_undoes_the_pipelines_normalisation(statistics: str) -> None:
    """What the rollouts decode: normalised latents -> the VAE's decode of the raw ones, in [0, 1]
    (FLUX's shift and scale; Wan-style per-channel statistics in the config)."""
    from diffusers import AutoencoderKL

    from mmcore.kits.diffusion.pipelines import normalise_latents, vae_frames

    torch.manual_seed(0)
    extra = {"shift_factor": 0.1, "scaling_factor": 0.4} if statistics == "shift" else {"latents_mean": [0.1, -0.2, 0.3, 0.0], "latents_std": [0.5, 1.5, 1.0, 2.0], "scaling_factor": 1.0}
    vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=4, **extra).eval()
    raw = torch.randn(2, 4, 4, 4)
    frames = vae_frames(vae, normalise_latents(vae, raw))
    with torch.no_grad():
        expected = ((vae.decode(raw).sample + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)[:, None]
    assert frames.shape == (2, 1, 4, 4, 3) and torch.allclose(frames, expected, atol=1e-5)
