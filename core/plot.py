"""``train.png``: the loss and throughput curves a user looks at first."""

from __future__ import annotations

import json
from pathlib import Path


def plot_training(stage_dir: Path, history: list[dict[str, float]], throughput: str) -> None:
    """``train.png``: loss and throughput against step, from ``metrics.jsonl`` (all attempts)."""
    path = stage_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else history
    by_step = {int(r["step"]): r for r in rows if "loss" in r}  # a resumed run repeats steps: keep the last
    rows = [by_step[k] for k in sorted(by_step)]
    if not rows:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_title("training loss")
    ax2.plot([r["step"] for r in rows], [r.get(throughput, float("nan")) for r in rows])
    ax2.set_xlabel("step")
    ax2.set_ylabel(throughput.replace("_per_s", "/s"))
    ax2.set_title("throughput")
    fig.tight_layout()
    fig.savefig(stage_dir / "train.png", dpi=90)
    plt.close(fig)


__all__ = ["plot_training"]
