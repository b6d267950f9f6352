"""Metric and event sink: every stage start/finish/skip and every metric, as JSON lines.

Writes ``<run_dir>/events.jsonl`` (the run's history across invocations) and
``<stage_dir>/metrics.jsonl`` (one line per ``ctx.log_metrics`` call).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mmcore import hookimpl


def _append(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


@hookimpl
def mmcore_stage_started(ctx):
    if ctx.world.is_main:
        _append(ctx.run_dir / "events.jsonl", {"time": time.time(), "event": "started", "stage": ctx.stage, "resume": ctx.resume, "world_size": ctx.world.world_size})


# metrics.jsonl stays open while its stage runs: opening, appending and closing it on every
# step cost the train loop ~0.7 ms a step (bench/engine_overhead.py). Each line is flushed to
# the OS as it is written, as closing did, so a killed run keeps every line it logged.
_metric_files: dict[Path, Any] = {}


def _log_line(path: Path, record: dict[str, Any]) -> None:
    handle = _metric_files.get(path)
    if handle is None or handle.closed:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = _metric_files[path] = open(path, "a", encoding="utf-8")
    handle.write(json.dumps(record, default=str) + "\n")
    handle.flush()


@hookimpl
def mmcore_stage_finished(ctx, manifest, error):
    handle = _metric_files.pop(ctx.stage_dir / "metrics.jsonl", None)
    if handle is not None:
        handle.close()
    if ctx.world.is_main:
        record: dict[str, Any] = {"time": time.time(), "event": "failed" if error else manifest.status, "stage": ctx.stage}
        if error is not None:
            record["error"] = f"{type(error).__name__}: {error}"
        _append(ctx.run_dir / "events.jsonl", record)


@hookimpl
def mmcore_stage_skipped(stage, run_dir, reason):
    _append(Path(run_dir) / "events.jsonl", {"time": time.time(), "event": "skipped", "stage": stage, "reason": reason})


@hookimpl
def mmcore_log_metrics(ctx, step, metrics, wall_time):
    _log_line(ctx.stage_dir / "metrics.jsonl", {"step": step, "time": wall_time, **metrics})


@hookimpl
def mmcore_metrics_resumed(ctx, step):
    # the rows of steps after the checkpoint are run again: rewrite the file without them
    # (atomically, so a kill now leaves the old file or the new one)
    path = ctx.stage_dir / "metrics.jsonl"
    handle = _metric_files.pop(path, None)
    if handle is not None:
        handle.close()
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            row_step = json.loads(line).get("step")
        except ValueError:
            continue  # a line a kill cut short
        if not isinstance(row_step, int) or row_step <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    from mmcore.framework.files import atomic_write_text

    atomic_write_text(path, "".join(kept))
