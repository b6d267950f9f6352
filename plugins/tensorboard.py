"""TensorBoard metric sink: ``<stage_dir>/tensorboard``, when the tensorboard package is installed."""

from __future__ import annotations

import importlib.util
from typing import Any

from mmcore import hookimpl

_writers: dict[str, Any] = {}
_purge: dict[str, int] = {}  # stage folder -> first step to log again after a resume
_installed: bool | None = None  # looked up once: find_spec walks sys.path on every call


def _tensorboard_installed() -> bool:
    global _installed
    if _installed is None:
        _installed = importlib.util.find_spec("tensorboard") is not None
    return _installed


def _writer(ctx: Any) -> Any:
    key = str(ctx.stage_dir)
    if key not in _writers:
        from torch.utils.tensorboard import SummaryWriter

        # its own thread writes every 10 s and at close; flushing after every step costs the
        # train loop a write per step (metrics.jsonl is the record a crash must not lose)
        # purge_step: TensorBoard drops the earlier attempts' events from that step on
        _writers[key] = SummaryWriter(log_dir=str(ctx.stage_dir / "tensorboard"), flush_secs=10, purge_step=_purge.pop(key, None))
    return _writers[key]


@hookimpl
def mmcore_log_metrics(ctx, step, metrics):
    if not _tensorboard_installed():
        return
    writer = _writer(ctx)
    for name, value in metrics.items():
        if isinstance(value, (int, float)):
            writer.add_scalar(f"{ctx.stage}/{name}", value, step)


@hookimpl
def mmcore_stage_finished(ctx):
    writer = _writers.pop(str(ctx.stage_dir), None)
    if writer is not None:
        writer.close()


@hookimpl
def mmcore_metrics_resumed(ctx, step):
    if _tensorboard_installed() and (ctx.stage_dir / "tensorboard").is_dir():
        _purge[str(ctx.stage_dir)] = step + 1

