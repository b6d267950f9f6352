"""The next step's micro-batches read and collated on a thread while this step computes
(``training.prefetch``).

Reading samples and collating them is the part of a step the model waits for (``data_time_s``):
a few milliseconds for the demos, tens for real-size images and clips, each step. The sampler's
plan is fixed by its position, so the next step's sample indices are known before it starts
(:meth:`~mmcore.train.sampler.PlannedSampler.peek_batch`): one worker thread reads and collates
them while the current step runs forward and backward (torch releases the GIL in its kernels).

Nothing about a run changes with it: the sampler is advanced by the step itself, as without a
prefetch, so checkpoints hold the same position; the step takes the prefetched batches only if
they are of the very indices it drew (otherwise it reads them itself); collation draws nothing
from a random generator (randomness comes from ``sample_seeds``, set by the step); an error in
reading or collating reaches the step that takes the batches, as it would have without the
thread, and one for a step that never runs (past the last) is never raised.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence


class Prefetch:
    """One step ahead: :meth:`ahead` after a step drew its batches, :meth:`take` in the next."""

    def __init__(self, data: Sequence[Any], collate: Callable[[list[Any]], dict[str, Any]], accum: int, *, step_on_cpu: bool = True) -> None:
        """``step_on_cpu``: the step computes on the CPU's cores, so the thread collates on one
        of them (:func:`_one_intraop_thread`); on an accelerator they are the collation's."""
        self.data, self.collate, self.accum = data, collate, accum
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmcore-prefetch", initializer=_one_intraop_thread if step_on_cpu else None)
        self._next: tuple[list[list[int]], Future] | None = None

    @staticmethod
    def wanted(sampler: Any, enabled: bool) -> bool:
        return enabled and callable(getattr(sampler, "peek_batch", None))

    def _read(self, drawn: list[list[int]]) -> tuple[list[list[Any]], list[dict[str, Any]]]:
        samples = [[self.data[i] for i in indices] for indices in drawn]
        return samples, [self.collate(chosen) for chosen in samples]

    def ahead(self, sampler: Any) -> None:
        """Start reading the micro-batches the sampler gives next (it is not advanced)."""
        drawn = [sampler.peek_batch(a) for a in range(self.accum)]
        self._next = (drawn, self._pool.submit(self._read, drawn))

    def take(self, drawn: list[list[int]]) -> tuple[list[list[Any]], list[dict[str, Any]]] | None:
        """The samples and micro-batches of ``drawn`` if they were read ahead, else None."""
        pending, self._next = self._next, None
        if pending is None:
            return None
        if pending[0] != drawn:
            pending[1].cancel()
            return None
        return pending[1].result()

    def close(self) -> None:
        self._next = None
        self._pool.shutdown(wait=True, cancel_futures=True)


def _one_intraop_thread() -> None:
    """The prefetch thread's torch ops run on one thread where the step computes on the CPU:
    this thread's own OpenMP setting, through the OpenMP runtime torch loaded. With the default,
    its first parallel op (a ``torch.cat`` of a batch's pixels) started a second OpenMP team
    beside the step's, on the same cores: on 2 cores at 2 threads the qwen2vl peers job stepped
    in 48-53 ms with the prefetch, 28-35 without and 28 with this (``bench/peers.py``'s job, 200
    steps; the collation it hides takes 1.2 ms). Not ``torch.set_num_threads(1)``: it also sets
    process-wide state (the thread pool some CPU kernels use), which changed later runs' numbers
    in the same process. Where no such runtime is found, the thread keeps the default."""
    import ctypes
    from pathlib import Path

    import torch

    torch.get_num_threads()  # torch sets each thread's count once, lazily: before ours, not over it
    for library in sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*")):
        try:
            ctypes.CDLL(str(library)).omp_set_num_threads(1)
            return
        except (OSError, AttributeError):
            continue


__all__ = ["Prefetch"]
