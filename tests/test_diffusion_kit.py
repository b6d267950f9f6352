"""Pieces of the diffusion kit every diffusion pack relies on: the noise levels it draws."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("sampling", ["uniform", "logit_normal"])
def test_one_experts_noise_levels_are_the_full_distribution_cut_to_its_range(sampling: str) -> None:
    """Wan2.2's experts train on their side of the boundary: the kit draws from the same
    shifted distribution, restricted to [lo, hi) (inverse CDF over the range's share), so the
    draws match drawing from the whole distribution and keeping what falls in the range."""
    from types import SimpleNamespace

    from mmcore.kits.diffusion import sigmas

    cfg = SimpleNamespace(flow_shift=3.0, timestep_sampling=sampling)
    full = sigmas(200_000, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(sigmas(5, cfg, torch.Generator().manual_seed(1)), sigmas(5, cfg, torch.Generator().manual_seed(1), within=(0.0, 1.0)))
    for lo, hi in ((0.875, 1.0), (0.0, 0.875), (0.3, 0.6)):
        cut = sigmas(50_000, cfg, torch.Generator().manual_seed(2), within=(lo, hi))
        assert bool(((cut >= lo) & (cut <= hi)).all())
        kept = full[(full >= lo) & (full < hi)]
        quantiles = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9])
        # sampling error of a quantile with >= 10^4 draws: well under 0.01 of the range
        assert torch.allclose(torch.quantile(cut, quantiles), torch.quantile(kept, quantiles), atol=0.01 * (hi - lo)), (lo, hi)
