"""Pieces of the train engine that every pack relies on: sampling, schedules, freezing."""

from __future__ import annotations

import pytest

from mmcore.errors import StageError
from mmcore.train.loop import EpochSampler, lr_lambda


def test_sampler_ranks_split_one_global_batch_and_groups_never_mix() -> None:
    groups = ["a"] * 10 + ["b"] * 7 + ["c"] * 1
    ranks = [EpochSampler(18, seed=3, rank=r, world=2, batch=2, groups=groups) for r in range(2)]
    seen = []
    for _ in range(12):  # several epochs
        parts = [s.next_batch()[0] for s in ranks]
        together = parts[0] + parts[1]
        assert len({groups[i] for i in together}) == 1
        assert len(set(together)) == (1 if groups[together[0]] == "c" else 4)
        seen.append(together)
    # a group smaller than a global batch trains, its samples repeated to fill one (never left out)
    assert [17, 17, 17, 17] in seen and ranks[0].repeated == 3
    assert ranks[0].left_out() == 2 + 3  # the ragged tails of a and b sit out each epoch


def test_sampler_resumes_at_any_position_and_reshuffles_each_epoch() -> None:
    straight = EpochSampler(20, seed=1, rank=0, world=1, batch=4)
    seen = [straight.next_batch() for _ in range(11)]
    resumed = EpochSampler(20, seed=1, rank=0, world=1, batch=4)
    resumed.position = 6
    assert [resumed.next_batch() for _ in range(5)] == seen[6:]
    epoch0 = sorted(i for batch, epoch in seen if epoch == 0 for i in batch)
    assert epoch0 == list(range(20))  # an epoch sees every sample once
    assert [b for b, e in seen if e == 1] != [b for b, e in seen if e == 0]


def test_sampler_plans_each_epoch_once() -> None:
    sampler = EpochSampler(20, seed=1, rank=0, world=1, batch=4)
    planned = []
    steps = sampler.steps
    sampler.steps = lambda epoch: planned.append(epoch) or steps(epoch)  # type: ignore[method-assign]
    for _ in range(15):  # three epochs of five micro-batches
        sampler.next_batch()
    assert planned == [1, 2]  # epoch 0 was planned at construction; none planned again


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

    from mmcore.train.ema import MovingAverage

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


def _long_tailed_costs(n: int, seed: int = 0) -> list[float]:
    """Tower tokens of a real-looking mix: 60 % text only, 25 % one image, 10 % a video, 5 % several images."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        out.append(0.0 if u < 0.6 else rng.randint(100, 400) if u < 0.85 else rng.randint(1500, 4000) if u < 0.95 else rng.randint(800, 2400))
    return out


def _imbalance(samplers: list[EpochSampler], costs: list[float], steps: int) -> float:
    """Over the steps, the sum of the busiest rank's tower tokens / the sum of the ranks' mean:
    the share of tower time the ranks spend waiting for the busiest one, plus one."""
    busiest = mean = 0.0
    for _ in range(steps):
        work = [sum(costs[i] for i in s.next_batch()[0]) for s in samplers]
        busiest, mean = busiest + max(work), mean + sum(work) / len(work)
    return busiest / mean


@pytest.mark.parametrize("world,batch", [(2, 1), (4, 2)])
def test_sampler_balances_tower_work_and_keeps_the_global_batches(world: int, batch: int) -> None:
    costs = _long_tailed_costs(2000)
    balanced = [EpochSampler(len(costs), seed=1, rank=r, world=world, batch=batch, costs=costs) for r in range(world)]
    plain = [EpochSampler(len(costs), seed=1, rank=r, world=world, batch=batch) for r in range(world)]
    assert _imbalance(balanced, costs, 300) <= 1.1 < 1.5 < _imbalance(plain, costs, 300)
    # one process with the whole global micro-batch sees the same samples in every step
    ranks = [EpochSampler(len(costs), seed=1, rank=r, world=world, batch=batch, costs=costs) for r in range(world)]
    one = EpochSampler(len(costs), seed=1, rank=0, world=1, batch=world * batch, costs=costs)
    for _ in range(250):
        assert sorted(i for s in ranks for i in s.next_batch()[0]) == sorted(one.next_batch()[0])


def test_sampler_with_equal_costs_plans_as_without() -> None:
    alike = EpochSampler(40, seed=2, rank=1, world=2, batch=2, costs=[7.0] * 40)
    plain = EpochSampler(40, seed=2, rank=1, world=2, batch=2)
    assert [alike.next_batch() for _ in range(25)] == [plain.next_batch() for _ in range(25)]
