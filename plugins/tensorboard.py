"""TensorBoard metric sink: ``<stage_dir>/tensorboard``, when ``logging.report_to`` names
tensorboard (the default; a tracker like the others, :mod:`mmcore.framework.tracking`)."""

from __future__ import annotations

from typing import Any

from mmcore import hookimpl
from mmcore.framework.tracking import active

_writers: dict[str, Any] = {}
_purge: dict[str, int] = {}  # stage folder -> first step to log again after a resume


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
def mmcore_log_metrics(ctx, step, metrics, wall_time):
    if not active(ctx, "tensorboard"):
        return
    from tensorboard.compat.proto.summary_pb2 import Summary

    # one event holding the step's scalars, as add_scalar writes each (simple_value, the same
    # tags): a summary per scalar cost the train loop ~0.1 ms each, every step
    values = [Summary.Value(tag=f"{ctx.stage}/{name}", simple_value=float(value)) for name, value in metrics.items() if isinstance(value, (int, float))]
    if values:
        _writer(ctx)._get_file_writer().add_summary(Summary(value=values), step, walltime=wall_time)


@hookimpl
def mmcore_stage_finished(ctx):
    writer = _writers.pop(str(ctx.stage_dir), None)
    if writer is not None:
        writer.close()


@hookimpl
def mmcore_metrics_resumed(ctx, step):
    if active(ctx, "tensorboard") and (ctx.stage_dir / "tensorboard").is_dir():
        _purge[str(ctx.stage_dir)] = step + 1
