"""The train stage's progress line: absolute step numbers, the loss, time spent and time left.

A resumed run counts from where it stopped (after a resume at step 40 of 100: 41..100, bar
at 40 %), and its speed and time left are measured on this attempt's steps only. The loss is
the step's loss the loop already has as a Python float (it calls ``.item()`` once a step to
decide whether to apply the update), so the line costs no device sync. On a terminal, rich
redraws it from its own thread at most four times a second; the loop only stores numbers.
Elsewhere (CI logs, files) a plain line every ~10 s, and one when the last step is done.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterator

from mmcore.framework.console import say

#: Seconds between two plain lines when stderr is not a terminal.
EVERY_S = 10.0


def clock(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h}:{m:02d}:{s:02d}"


class TrainProgress:
    """``for step in TrainProgress(ctx, start, total): ...; bar.loss = step_loss`` (main process
    draws; the others just count)."""

    def __init__(self, ctx: Any, start: int, total: int, *, tty: bool | None = None, console: Any = None) -> None:
        self.start, self.total, self.loss = start, total, float("nan")
        self.enabled = ctx.world.is_main
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.console = console  # rich's Console (default: the terminal's)

    def __iter__(self) -> Iterator[int]:
        if not self.enabled:
            yield from range(self.start, self.total)
        elif self.tty:
            yield from self._bar()
        else:
            yield from self._lines()

    def _bar(self) -> Iterator[int]:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        columns = [
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        ]
        with Progress(*columns, refresh_per_second=4, transient=False, console=self.console) as bar:
            task = bar.add_task("train", total=self.total, completed=self.start, loss="-")
            for step in range(self.start, self.total):
                yield step
                bar.update(task, completed=step + 1, loss=f"{self.loss:.4g}")

    def _lines(self) -> Iterator[int]:
        began = last = time.monotonic()
        for step in range(self.start, self.total):
            yield step
            now, done = time.monotonic(), step + 1
            if now - last >= EVERY_S or done == self.total:
                last = now
                rate = (done - self.start) / max(now - began, 1e-9)
                left = (self.total - done) / rate if rate > 0 else float("nan")
                say(f"train: step {done}/{self.total}, loss {self.loss:.4g}, {rate:.2f} step/s, elapsed {clock(now - began)}, ETA {clock(left) if left == left else '?'}", err=True)


__all__ = ["TrainProgress"]
