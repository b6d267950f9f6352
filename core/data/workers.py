"""``data.num_workers``: the preprocess stages encode samples in worker processes, in order.

Encoding (decoding images, audio and video, resizing, tokenizing) is most of preprocess, and
samples are independent: :func:`map_in_order` runs the encode function over the items in
``num_workers`` forked processes and yields the results in the items' order, so the shards
written are the same bytes whatever the worker count. The parent keeps what must be serial:
the bad-sample report, the shard writer, the progress bar.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

# Set in the parent just before the pool forks; each worker inherits it (nothing is pickled
# but the items and the results).
_TASK: tuple[Callable[[Any], Any], tuple[type[BaseException], ...], Callable[[Any], bool]] | None = None


class Failed:
    """What an item's encoding raised (one of the expected errors), as its message."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __str__(self) -> str:
        return self.message


def _start_worker() -> None:
    import torch

    torch.set_num_threads(1)  # the workers are the parallelism


def _encode(item: Any) -> bytes:
    assert _TASK is not None
    fn, errors, passes = _TASK
    if passes(item):
        return pickle.dumps(item)
    try:
        return pickle.dumps(fn(item))  # plain pickle: tensors travel as bytes, not shared-memory handles
    except errors as exc:
        return pickle.dumps(Failed(str(exc)))


def map_in_order(fn: Callable[[T], Any], items: Iterable[T], num_workers: int, *, errors: tuple[type[BaseException], ...] = (),
                 passes: Callable[[T], bool] = lambda item: False) -> Iterator[tuple[T, Any]]:
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

    items = list(items)
    _TASK = (fn, errors, passes)
    try:
        with multiprocessing.get_context("fork").Pool(num_workers, initializer=_start_worker) as pool:
            for item, result in zip(items, pool.imap(_encode, items, chunksize=4)):
                # bytes this process's own forked worker pickled, read from the pool's pipe (which
                # unpickles every result anyway); nothing from a file or another machine
                yield item, pickle.loads(result)
    finally:
        _TASK = None


__all__ = ["Failed", "map_in_order"]
