"""The text ``mmcore plan`` prints: the model, the assumptions, and the ranked layouts."""

from __future__ import annotations

from mmcore.plan.devices import GIB, Device
from mmcore.plan.layouts import EFFICIENCY, RUNTIME_BYTES, Estimate
from mmcore.plan.model import Planned


def _gib(n: float) -> str:
    return f"{n / GIB:7.1f}"


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def render(plan: Planned, device: Device, nodes: int, per_node: int, estimates: list[Estimate], *, micro_batch: int, global_batch: int, bf16: bool, top: int = 12) -> str:
    """The plan as a table: the ``top`` layouts, the best fitting one named on the last line."""
    lines = [
        f"model: {_count(plan.parameters)} parameters ({_count(plan.trained)} trained); " + ", ".join(f"{k} {_count(v)}" for k, v in plan.groups.items()),
        *plan.notes,
        f"cluster: {nodes} x {per_node} {device.name} ({device.memory / GIB:.1f} GiB, {device.peak / 1e12:.0f} TFLOP/s bf16 peak)",
        f"step: {global_batch} rows, micro-batches of {micro_batch} row(s), {'bf16' if bf16 else 'fp32'} compute; "
        f"step time at {EFFICIENCY:.0%} of peak (assumed), {RUNTIME_BYTES / GIB:.0f} GiB runtime per rank (assumed)",
        "",
        f"{'layout':<38} {'weights':>7} {'grads':>7} {'optim':>7} {'act':>7} {'act-rc':>7} {'buffers':>7} {'total':>7}  {'fits':<4} {'step s':>8} {'MFU':>5}  runnable",
    ]
    for e in estimates[:top]:
        lines.append(
            f"{e.layout.name():<38} {_gib(e.weights)} {_gib(e.grads)} {_gib(e.optimizer)} {_gib(e.activations)} {_gib(e.activations_other if not e.layout.recompute else e.activations)} {_gib(e.buffers)} {_gib(e.total)}  "
            f"{'yes' if e.fits else 'no':<4} {e.step_s:8.2f} {e.mfu:5.1%}  {e.runnable or 'yes'}" + (f" (host {e.host / GIB:.0f} GiB)" if e.host else "")
        )
    lines.append(
        "GiB per rank; act: the layout's activations, act-rc: with full recompute; offload keeps weights, gradients and optimizer state in host memory; sync-mb: parallel.gradient_sync=micro_batch (the unsharded gradients of a step's micro-batches would not fit)"
    )
    best = next((e for e in estimates if e.fits and not e.runnable), None) or next((e for e in estimates if e.fits), None)
    if best is None:
        lines.append(f"no layout fits {device.memory / GIB:.0f} GiB: more ranks, a shorter sequence, or a smaller micro-batch")
    else:
        lines.append(
            f"best fitting layout: {best.layout.name()} ({best.total / GIB:.1f} GiB of {device.memory / GIB:.1f}, ~{best.step_s:.2f} s/step)" + (f", {best.runnable}" if best.runnable else "")
        )
    return "\n".join(lines)


def best_fitting(estimates: list[Estimate]) -> Estimate | None:
    """The first fitting layout mmcore runs today, else the first fitting one."""
    return next((e for e in estimates if e.fits and not e.runnable), None) or next((e for e in estimates if e.fits), None)


__all__ = ["render", "best_fitting"]
