"""training.prefetch: the next step's batches read on a thread are the batches the step would
have read, the sampler and the run are what they are without it, and errors surface where they
did."""

from __future__ import annotations

import threading

import pytest

from mmcore.train.prefetch import Prefetch
from mmcore.train.sampler import EpochSampler, TokenBudgetSampler


@pytest.mark.parametrize("make", [lambda: EpochSampler(23, seed=2, rank=1, world=2, batch=3), lambda: TokenBudgetSampler([5, 9, 3, 7, 2, 8, 6, 4] * 5, 16, 1, 0, 2)])
def test_peeking_is_what_the_next_draws_are_and_moves_nothing(make) -> None:  # type: ignore[no-untyped-def]
    sampler, straight = make(), make()
    for _ in range(3 * sampler.epoch_length()):  # across epoch boundaries
        ahead = [sampler.peek_batch(a) for a in range(3)]
        assert sampler.peek_batch(0) == ahead[0]  # peeking twice moves nothing
        assert straight.next_batch()[0] == ahead[0]
        sampler.next_batch()
    assert sampler.position == straight.position


def test_read_ahead_batches_are_taken_only_for_the_indices_drawn() -> None:
    reader = []
    data = [{"x": i} for i in range(30)]

    def collate(samples):  # type: ignore[no-untyped-def]
        reader.append(threading.current_thread().name)
        return {"ids": [s["x"] for s in samples]}

    sampler = EpochSampler(30, seed=0, rank=0, world=1, batch=4)
    prefetch = Prefetch(data, collate, accum=2)
    prefetch.ahead(sampler)
    drawn = [sampler.next_batch()[0] for _ in range(2)]
    samples, micro = prefetch.take(drawn)
    assert [m["ids"] for m in micro] == drawn and samples == [[data[i] for i in d] for d in drawn]
    assert reader and all(name.startswith("mmcore-prefetch") for name in reader)
    prefetch.ahead(sampler)
    assert prefetch.take([[0, 1, 2, 3], [4, 5, 6, 7]]) is None  # not what was read ahead: the step reads its own
    assert prefetch.take(drawn) is None  # taken once
    prefetch.close()


def test_a_read_error_reaches_the_step_that_takes_the_batches() -> None:
    def collate(samples):  # type: ignore[no-untyped-def]
        raise ValueError("shard-00003.safetensors: sample 7 is truncated")

    sampler = EpochSampler(8, seed=0, rank=0, world=1, batch=2)
    prefetch = Prefetch(list(range(8)), collate, accum=1)
    prefetch.ahead(sampler)
    with pytest.raises(ValueError, match="sample 7 is truncated"):
        prefetch.take([sampler.next_batch()[0]])
    prefetch.ahead(sampler)  # read ahead for a step that never runs: nothing is raised
    prefetch.close()


def test_the_prefetch_thread_collates_on_one_thread_and_the_step_keeps_its_own() -> None:
    """A second OpenMP team beside the step's made a 2-thread run slower than no prefetch at
    all (prefetch.py says by how much); the step's thread count must not change with it."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        sampler = EpochSampler(8, seed=0, rank=0, world=1, batch=2)
        prefetch = Prefetch(list(range(8)), lambda items: {"threads": torch.get_num_threads()}, accum=1)
        prefetch.ahead(sampler)
        _, micro = prefetch.take([sampler.next_batch()[0]])
        prefetch.close()
        assert micro[0]["threads"] == 1
        torch.ones(64, 64, requires_grad=True).pow(2).sum().backward()  # a step's backward after it
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
