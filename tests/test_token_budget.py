"""Token-budget packing (training.max_tokens): rows filled to a budget from a deterministic,
resumable, length-aware sampler that gives every rank comparable work."""

from __future__ import annotations

import random

import pytest

from mmcore.data.synthetic import vlm_mix_lengths as long_tailed_mix
from mmcore.errors import StageError
from mmcore.train.sampler import TokenBudgetSampler


def test_bins_fit_the_budget_use_each_sample_once_and_fill_it() -> None:
    lengths = long_tailed_mix()
    sampler = TokenBudgetSampler(lengths, 8192, seed=3, rank=0, world=2)
    bins = sampler.bins(0)
    used = [i for b in bins for i in b]
    assert sorted(used) == list(range(len(lengths)))  # every sample once per epoch
    assert all(sum(lengths[i] for i in b) <= 8192 for b in bins)
    assert sampler.fill() >= 0.97, sampler.fill()  # the goal, on the mix it names


def test_ranks_split_each_global_micro_batch_and_resume_anywhere() -> None:
    lengths = long_tailed_mix(600)
    ranks = [TokenBudgetSampler(lengths, 8192, seed=1, rank=r, world=2) for r in range(2)]
    seen, totals = [], [0, 0]
    for _ in range(40):  # more than an epoch
        a, b = (s.next_batch()[0] for s in ranks)
        assert not set(a) & set(b)
        for r, x in enumerate((a, b)):
            totals[r] += sum(lengths[i] for i in x)
        seen.append((a, b))
    # comparable work: the ranks' token totals within 5 %; nearly every step full on both
    assert min(totals) >= 0.95 * max(totals), totals
    full = [min(sum(lengths[i] for i in x) for x in pair) >= 0.98 * 8192 for pair in seen]
    assert sum(full) >= 0.9 * len(full), full
    again = TokenBudgetSampler(lengths, 8192, seed=1, rank=1, world=2)
    again.position = 17
    assert again.next_batch()[0] == seen[17][1]
    other_seed = TokenBudgetSampler(lengths, 8192, seed=2, rank=0, world=2)
    assert other_seed.next_batch()[0] != seen[0][0]


def test_a_sample_longer_than_the_budget_is_one_line() -> None:
    with pytest.raises(StageError, match=r"1 of 3 samples are longer than training.max_tokens=100 \(longest 150 tokens\)"):
        TokenBudgetSampler([50, 150, 60], 100, seed=0, rank=0, world=1)


def test_pad_to_longest_wastes_what_packing_fills() -> None:
    """The control: the same mix in batches of 8 padded to their longest sample."""
    lengths = long_tailed_mix()
    rng = random.Random(0)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = [order[i : i + 8] for i in range(0, len(order) - 7, 8)]
    padded = sum(lengths[i] for b in batches for i in b) / sum(8 * max(lengths[i] for i in b) for b in batches)
    assert padded < 0.6, padded


def test_ranks_of_a_step_get_alike_tower_work_with_costs() -> None:
    """With tower costs (vision patches per sample) the bins of a step carry alike tower work;
    text fill and every-sample-once stay as they were; equal costs change nothing."""
    from mmcore.data.synthetic import vlm_mix_work

    lengths, towers = vlm_mix_work(3000)

    def imbalance(costs: list[int] | None) -> float:
        ranks = [TokenBudgetSampler(lengths, 8192, seed=1, rank=r, world=4, costs=costs) for r in range(4)]
        busiest = mean = 0.0
        for _ in range(len(ranks[0].steps(0))):
            work = [sum(towers[i] for i in s.next_batch()[0]) for s in ranks]
            busiest, mean = busiest + max(work), mean + sum(work) / 4
        return busiest / mean

    assert imbalance(towers) <= 1.1 < imbalance(None), (imbalance(towers), imbalance(None))
    balanced = TokenBudgetSampler(lengths, 8192, seed=1, rank=0, world=4, costs=towers)
    plain = TokenBudgetSampler(lengths, 8192, seed=1, rank=0, world=4)
    assert sorted(map(sorted, balanced.bins(0))) == sorted(map(sorted, plain.bins(0)))  # the same rows, dealt otherwise
    assert balanced.fill() == plain.fill()
    alike = TokenBudgetSampler(lengths, 8192, seed=1, rank=2, world=4, costs=[5] * len(lengths))
    assert alike.steps(0) == TokenBudgetSampler(lengths, 8192, seed=1, rank=2, world=4).steps(0)
