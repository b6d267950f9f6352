"""Pieces of the train engine that every pack relies on: sampling, schedules, freezing."""

from __future__ import annotations

import pytest

from mmcore.errors import StageError
from mmcore.train import EpochSampler, lr_lambda


def test_sampler_ranks_split_one_global_batch_and_groups_never_mix() -> None:
    groups = ["a"] * 10 + ["b"] * 7 + ["c"] * 1
    ranks = [EpochSampler(18, seed=3, rank=r, world=2, batch=2, groups=groups) for r in range(2)]
    for _ in range(12):  # several epochs
        parts = [s.next_batch()[0] for s in ranks]
        together = parts[0] + parts[1]
        assert len(together) == 4 and len(set(together)) == 4
        assert len({groups[i] for i in together}) == 1
        assert groups[together[0]] != "c"  # a group smaller than a global batch is never used


def test_sampler_resumes_at_any_position_and_reshuffles_each_epoch() -> None:
    straight = EpochSampler(20, seed=1, rank=0, world=1, batch=4)
    seen = [straight.next_batch() for _ in range(11)]
    resumed = EpochSampler(20, seed=1, rank=0, world=1, batch=4)
    resumed.position = 6
    assert [resumed.next_batch() for _ in range(5)] == seen[6:]
    epoch0 = sorted(i for batch, epoch in seen if epoch == 0 for i in batch)
    assert epoch0 == list(range(20))  # an epoch sees every sample once
    assert [b for b, e in seen if e == 1] != [b for b, e in seen if e == 0]


def test_sampler_refuses_a_dataset_smaller_than_a_global_batch() -> None:
    with pytest.raises(StageError, match="fewer than one global micro-batch"):
        EpochSampler(3, seed=0, rank=0, world=2, batch=2)


def test_schedules_warm_up_then_decay() -> None:
    cosine = lr_lambda("cosine", warmup=4, total=14, min_ratio=0.1)
    assert [cosine(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cosine(4) == pytest.approx(1.0) and cosine(14) == pytest.approx(0.1) and cosine(9) == pytest.approx(0.55)
    linear = lr_lambda("linear", warmup=0, total=10, min_ratio=0.0)
    assert linear(5) == pytest.approx(0.5)
    assert lr_lambda("constant", warmup=2, total=10, min_ratio=0.0)(7) == 1.0


def test_moving_average_follows_diffusers_ema_model() -> None:
    """training.ema averages as diffusers' EMAModel does (its warm-up decay included), which
    diffusion users compare against; rounding differs (lerp vs. its subtract), hence a tolerance."""
    torch = pytest.importorskip("torch")
    training_utils = pytest.importorskip("diffusers.training_utils")

    from mmcore.ema import MovingAverage

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ours = MovingAverage(model.named_parameters(), decay=0.95)
    theirs = training_utils.EMAModel(model.parameters(), decay=0.95)
    for step in range(1, 40):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ours.update(step)
        theirs.step(model.parameters())
        assert theirs.cur_decay_value == pytest.approx(0.0 if step == 1 else min(0.95, step / (9 + step)))
        for name, shadow in zip(dict(model.named_parameters()), theirs.shadow_params):
            torch.testing.assert_close(ours.state_dict()[name], shadow, rtol=1e-5, atol=1e-6)
