"""``train.png``: the curves a user looks at first: the training loss with the learning rate
beside it, the held-out metric the run is judged by, and throughput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The held-out metric a panel shows, first found: the ones the demos promise a figure for
#: (tools/demo_matrix.py: accuracy, WER, DPO's preference accuracies, the diffusion loss at
#: fixed noise, which the demos judge against its value before training).
HELD_OUT = ("eval/accuracy", "eval/wer", "eval/rewards/accuracy", "eval/implicit_accuracy", "eval/loss")


def plot_training(stage_dir: Path, history: list[dict[str, float]], throughput: str) -> list[str]:
    """``train.png`` from ``metrics.jsonl`` (all attempts; else ``history``): loss and learning
    rate, the held-out metric (logged every ``training.eval_every``), and throughput, by step.
    Returns the panels' titles (none when there was nothing to plot or no matplotlib)."""
    path = stage_dir / "metrics.jsonl"
    logged = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else history
    rows = last_per_step(r for r in logged if "loss" in r)  # a resumed run repeats steps: keep the last
    if not rows:
        return []
    held = last_per_step(r for r in logged if any(k.startswith("eval/") for k in r))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    steps = [r["step"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 3.6))
    ax1.plot(steps, [r["loss"] for r in rows], color="C0")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss", color="C0")
    ax1.set_title("training loss and learning rate")
    if any("lr" in r for r in rows):
        lr = ax1.twinx()
        lr.plot(steps, [r.get("lr", float("nan")) for r in rows], color="C1", linestyle="--", linewidth=1)
        lr.set_ylabel("learning rate", color="C1")
        lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    held_out_panel(ax2, held)
    ax3.plot(steps, [r.get(throughput, float("nan")) for r in rows])
    ax3.set_xlabel("step")
    ax3.set_ylabel(throughput.replace("_per_s", "/s"))
    ax3.set_title("throughput")
    fig.tight_layout()
    fig.savefig(stage_dir / "train.png", dpi=90)
    plt.close(fig)
    return [ax.get_title() for ax in (ax1, ax2, ax3)]


def held_out_panel(ax: Any, held: list[dict[str, Any]]) -> None:
    """The held-out metric against step, its first and last values in the title."""
    names = [k for r in held for k in r if k.startswith("eval/") and isinstance(r[k], (int, float))]
    name = next((k for k in HELD_OUT if k in names), names[0] if names else None)
    ax.set_xlabel("step")
    if name is None:
        ax.set_title("held-out metric")
        ax.text(0.5, 0.5, "none logged\n(training.eval_every, or no held-out split)", ha="center", va="center", transform=ax.transAxes, color="grey")
        return
    points = [(r["step"], float(r[name])) for r in held if name in r]
    ax.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3, color="C2")
    label = name.removeprefix("eval/")
    ax.set_ylabel(f"held-out {label}")
    first, last = points[0][1], points[-1][1]
    change = f" ({last / first:.2f}x)" if name == "eval/loss" and first else ""  # the diffusion demos promise a ratio
    ax.set_title(f"held-out {label}: {first:.3g} at step {points[0][0]} -> {last:.3g}{change}")


def last_per_step(rows: Any) -> list[dict[str, Any]]:
    by_step = {int(r["step"]): r for r in rows}
    return [by_step[k] for k in sorted(by_step)]


__all__ = ["plot_training"]
