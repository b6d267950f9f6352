"""Terminal output: status lines, and progress bars that degrade to periodic lines in logs."""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def say(message: str, *, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    print(message, file=stream, flush=True)


def progress(
    items: Iterable[T],
    *,
    total: int | None = None,
    description: str = "",
    unit: str = "it",
    enabled: bool = True,
) -> Iterator[T]:
    """Iterate ``items`` with a progress bar on a terminal, or a line every ~10 s otherwise.

    Shows the rate (``unit``/s) and the time left when ``total`` is known.
    """
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if not enabled:
        yield from items
        return
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.text import Text

        class RateColumn(ProgressColumn):
            def render(self, task):  # type: ignore[no-untyped-def]
                return Text(f"{task.speed:.1f} {unit}/s" if task.speed else f"- {unit}/s")

        columns = [
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            RateColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        ]
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task(description, total=total)
            for item in items:
                yield item
                bar.advance(task)
        return
    start = last = time.monotonic()
    done = 0
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= 10:
            last = now
            rate = done / (now - start)
            of = f"/{total}" if total else ""
            say(f"{description}: {done}{of} {unit} ({rate:.1f} {unit}/s)", err=True)
