"""``data.num_workers``: the preprocess stages encode samples in worker processes, in order.

Encoding (decoding images, audio and video, resizing, tokenizing) is most of preprocess, and
samples are independent: :func:`map_in_order` runs the encode function over the items in
``num_workers`` forked processes and yields the results in the items' order, so the shards
written are the same bytes whatever the worker count. The parent keeps what must be serial:
the bad-sample report, the shard writer, the progress bar.
"""

from __future__ import annotations

import os
import pickle
from collections import deque
from typing import Any, Callable, Iterable, Iterator, TypeVar

from mmcore.errors import StageError

T = TypeVar("T")
_CHUNK = 4  # items per task: one pipe round trip per few samples
_WINDOW = 4  # tasks in flight per worker

# Set in the parent just before the pool forks; each worker inherits it (nothing is pickled
# but the items and the results).
_TASK: tuple[Callable[[Any], Any], tuple[type[BaseException], ...], Callable[[Any], bool]] | None = None


class Failed:
    """What an item's encoding raised (one of the expected errors), as its message."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __str__(self) -> str:
        return self.message


def _start_worker(parent: int) -> None:
    import torch

    from mmcore.run.lifeline import die_with_parent

    die_with_parent(parent)  # a killed stage leaves no worker behind
    torch.set_num_threads(1)  # the workers are the parallelism


def _encode_chunk(chunk: list[Any]) -> list[bytes]:
    return [_encode(item) for item in chunk]


def _encode(item: Any) -> bytes:
    assert _TASK is not None
    fn, errors, passes = _TASK
    if passes(item):
        return pickle.dumps(item)
    try:
        return pickle.dumps(fn(item))  # plain pickle: tensors travel as bytes, not shared-memory handles
    except errors as exc:
        return pickle.dumps(Failed(str(exc)))


def map_in_order(
    fn: Callable[[T], Any], items: Iterable[T], num_workers: int, *, errors: tuple[type[BaseException], ...] = (), passes: Callable[[T], bool] = lambda item: False
) -> Iterator[tuple[T, Any]]:
    """``(item, fn(item))`` for every item, in order.

    Args:
        fn: encodes one item; in workers it runs in a forked copy of this process.
        items: what to encode (picklable: they are sent to the workers).
        num_workers: 0 encodes here; N > 0 in N worker processes.
        errors: exceptions of ``fn`` that concern the item (a bad file): yielded as
            :class:`Failed` with the message; anything else propagates.
        passes: items for which ``fn`` is not called; yielded as they are (already-known bad
            samples).
    """
    global _TASK
    if num_workers <= 0:
        for item in items:
            if passes(item):
                yield item, item
                continue
            try:
                yield item, fn(item)
            except errors as exc:
                yield item, Failed(str(exc))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    items = list(items)
    chunks = [items[start : start + _CHUNK] for start in range(0, len(items), _CHUNK)]
    _TASK = (fn, errors, passes)
    # Not multiprocessing.Pool: its terminate() (what leaving it on an error does) can deadlock
    # on a lock a worker held when it was killed (CPython gh-96995; CI hung on it), and a worker
    # that dies makes imap wait forever. The executor lets running chunks finish, cancels the
    # rest, and turns a dead worker into BrokenProcessPool. The workers fork on the first submit,
    # after _TASK is set.
    executor = ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker, initargs=(os.getpid(),))
    try:
        in_flight: deque[Any] = deque()
        submitted = 0
        for first in range(0, len(items), _CHUNK):
            try:
                # a bounded window: results wait here only as long as the writer is behind by it
                while submitted < len(chunks) and len(in_flight) < _WINDOW * num_workers:
                    in_flight.append(executor.submit(_encode_chunk, chunks[submitted]))
                    submitted += 1
                results = in_flight.popleft().result()
            except BrokenProcessPool:
                raise StageError(
                    # the first unfinished chunk: at or before the one whose worker died
                    f"a data.num_workers process died while encoding the file's samples from #{first + 1} on (killed for memory, or a crash in a media decoder)",
                    hint="rerun preprocess with data.num_workers=0 to see which sample",
                ) from None
            for item, result in zip(items[first : first + _CHUNK], results):
                # bytes this process's own forked worker pickled, read from the executor's pipe
                # (which unpickles every result anyway); nothing from a file or another machine
                yield item, pickle.loads(result)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        _TASK = None


__all__ = ["Failed", "map_in_order"]
