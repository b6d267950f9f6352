"""data.num_workers: encoding in forked workers keeps the items' order, reports the expected
errors per item, and really runs in other processes."""

from __future__ import annotations

import os

import pytest

from mmcore.data.media import MediaError
from mmcore.data.workers import Failed, map_in_order


def encode(item: int) -> tuple[int, int]:
    if item % 7 == 3:
        raise MediaError(f"item {item} is unreadable")
    return item * item, os.getpid()


@pytest.mark.parametrize("workers", [0, 2])
def test_results_come_back_in_order_with_each_bad_item_named(workers: int) -> None:
    items = list(range(40)) + ["known bad"]
    out = list(map_in_order(encode, items, workers, errors=(MediaError,), passes=lambda item: isinstance(item, str)))
    assert [item for item, _ in out] == items
    assert out[-1] == ("known bad", "known bad")  # passed through, not encoded
    for item, result in out[:-1]:
        if item % 7 == 3:
            assert isinstance(result, Failed) and str(result) == f"item {item} is unreadable"
        else:
            assert result[0] == item * item
    pids = {result[1] for _, result in out[:-1] if not isinstance(result, Failed)}
    assert (pids == {os.getpid()}) if workers == 0 else (os.getpid() not in pids and 1 <= len(pids) <= 2)


def test_an_unexpected_error_in_a_worker_stops_the_stage() -> None:
    def broken(item: int) -> int:
        raise ValueError("a bug, not a bad file")

    with pytest.raises(ValueError, match="a bug, not a bad file"):
        list(map_in_order(broken, range(8), 2, errors=(MediaError,)))
