"""TensorBoard metric sink: ``<stage_dir>/tensorboard``, when the tensorboard package is installed."""

from __future__ import annotations

import importlib.util
from typing import Any

from mmcore import hookimpl

_writers: dict[str, Any] = {}


def _writer(ctx: Any) -> Any:
    key = str(ctx.stage_dir)
    if key not in _writers:
        from torch.utils.tensorboard import SummaryWriter

        _writers[key] = SummaryWriter(log_dir=str(ctx.stage_dir / "tensorboard"))
    return _writers[key]


@hookimpl
def mmcore_log_metrics(ctx, step, metrics):
    if importlib.util.find_spec("tensorboard") is None:
        return
    writer = _writer(ctx)
    for name, value in metrics.items():
        if isinstance(value, (int, float)):
            writer.add_scalar(f"{ctx.stage}/{name}", value, step)
    writer.flush()


@hookimpl
def mmcore_stage_finished(ctx):
    writer = _writers.pop(str(ctx.stage_dir), None)
    if writer is not None:
        writer.close()
