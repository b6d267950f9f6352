"""data.num_workers: encoding in forked workers keeps the items' order, reports the expected
errors per item, and really runs in other processes."""

from __future__ import annotations

import os
import signal

import pytest

from mmcore.data.media import MediaError
from mmcore.errors import StageError
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


@pytest.mark.parametrize("repeat", range(3))  # the old pool hung here now and then (CPython gh-96995)
def test_an_unexpected_error_in_a_worker_stops_the_stage(repeat: int) -> None:
    def broken(item: int) -> int:
        if item >= 5:
            raise ValueError("a bug, not a bad file")
        return item

    with pytest.raises(ValueError, match="a bug, not a bad file"):
        list(map_in_order(broken, range(40), 2, errors=(MediaError,)))


def test_a_worker_killed_midway_is_a_one_line_error_not_a_hang() -> None:
    def killed_on_the_ninth(item: int) -> int:
        if item == 9:
            os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        return item

    out = []
    with pytest.raises(StageError, match=r"a data.num_workers process died while encoding the file's samples from #(1|5|9) on \(killed for memory") as caught:
        for item, result in map_in_order(killed_on_the_ninth, range(40), 2):
            out.append(result)
    assert "data.num_workers=0" in caught.value.one_line()
    assert out == list(range(len(out))) and len(out) <= 8  # what came before the dead chunk, in order
