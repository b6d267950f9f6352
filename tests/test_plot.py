"""train.png: the loss with the learning rate beside it, the held-out metric a run is judged by
(the demos' promises: accuracy, WER, the diffusion loss at fixed noise against its start), and
throughput; a resumed run's repeated steps drawn once."""

from __future__ import annotations

import json
from pathlib import Path

from mmcore.train.plot import plot_training


def write(stage: Path, rows: list[dict]) -> None:  # type: ignore[type-arg]
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_plot_shows_the_held_out_metric_and_the_learning_rate(tmp_path: Path) -> None:
    rows = [{"step": 0, "eval/accuracy": 0.25}]
    rows += [{"step": s, "loss": 3.0 - s / 10, "lr": 1e-3 * s / 10, "tokens_per_s": 100.0} for s in range(1, 11)]
    rows += [{"step": 5, "eval/accuracy": 0.5, "eval/token_f1": 0.6}, {"step": 10, "eval/accuracy": 1.0}]
    rows += [{"step": 9, "loss": 2.1, "lr": 9e-4, "tokens_per_s": 90.0}]  # a resumed attempt repeats step 9
    write(tmp_path / "train", rows)
    titles = plot_training(tmp_path / "train", [], "tokens_per_s")
    assert titles == ["training loss and learning rate", "held-out accuracy: 0.25 at step 0 -> 1", "throughput"]
    assert (tmp_path / "train/train.png").stat().st_size > 10_000


def test_a_diffusion_run_shows_its_held_out_loss_against_its_start(tmp_path: Path) -> None:
    rows = [{"step": s, "loss": 1.0, "lr": 1e-3, "samples_per_s": 4.0} for s in range(1, 5)]
    rows += [{"step": 0, "eval/loss": 2.0}, {"step": 4, "eval/loss": 0.66}]
    write(tmp_path / "train", rows)
    assert plot_training(tmp_path / "train", [], "samples_per_s")[1] == "held-out loss: 2 at step 0 -> 0.66 (0.33x)"


def test_without_evaluation_the_panel_says_why(tmp_path: Path) -> None:
    write(tmp_path / "train", [{"step": 1, "loss": 1.0, "lr": 1e-3, "tokens_per_s": 1.0}])
    assert plot_training(tmp_path / "train", [], "tokens_per_s")[1] == "held-out metric"
