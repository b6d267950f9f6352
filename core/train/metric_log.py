"""The train loop's metric rows, handed to the metric sinks in bursts.

A sink's row costs the loop 0.1-0.2 ms of Python when it is written between two steps (measured
in the train loop on the qwen2vl demo, main-thread CPU time: TensorBoard's summary and the
``metrics.jsonl`` line; the same calls in a tight loop take a tenth of that): the step's tensors
have pushed the interpreter's working set out of the caches. At the demos' 20-30 ms steps that is
about 3 % of the step (``bench/engine_overhead.py``). So the loop keeps its rows and hands them
over together, at most ``EVERY_S`` apart: one cold call, the rest warm.

Nothing a resume needs is lost: the rows go out before every checkpoint is written, before a
held-out evaluation logs its own row, at the end and when the loop raises (a non-finite loss,
an error), so a run killed with ``SIGKILL`` loses only rows of steps after its last checkpoint,
which the resumed run trains and logs again. Each row keeps the wall time of its step.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Mapping

#: Seconds a row may wait for the sinks: the live view (TensorBoard, wandb) trails the run by
#: at most this (TensorBoard itself writes its file every 10 s).
EVERY_S = 1.0


class MetricLog:
    """``with MetricLog(ctx) as log: ... log.add(step, metrics) ... log.flush()``."""

    def __init__(self, ctx: Any, every_s: float = EVERY_S) -> None:
        self.ctx, self.every_s = ctx, every_s
        self.rows: list[tuple[int, dict[str, Any], float]] = []
        self.handed = time.monotonic()

    def add(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.rows.append((step, dict(metrics), time.time()))
        if time.monotonic() - self.handed >= self.every_s:
            self.flush()

    def flush(self) -> None:
        """Hand every kept row to the sinks, in step order."""
        rows, self.rows = self.rows, []
        for step, metrics, wall_time in rows:
            self.ctx.log_metrics(step, metrics, wall_time=wall_time)
        self.handed = time.monotonic()

    def __enter__(self) -> "MetricLog":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.flush()  # also when the loop raises: the rows up to the failing step are what the user reads first


__all__ = ["MetricLog", "EVERY_S"]
