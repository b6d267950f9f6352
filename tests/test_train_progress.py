"""The train progress line: absolute step numbers after a resume, the loss, elapsed and ETA,
plain lines where stderr is not a terminal (CI logs), nothing from the other ranks."""

from __future__ import annotations

import types

import pytest

from mmcore.train import progress as train_progress
from mmcore.train.progress import TrainProgress


def ctx(main: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(world=types.SimpleNamespace(is_main=main))


def test_a_run_resumed_at_step_40_of_100_counts_41_to_100(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(train_progress, "EVERY_S", 0.0)  # a line every step
    bar = TrainProgress(ctx(), 40, 100, tty=False)
    steps = []
    for step in bar:
        steps.append(step)
        bar.loss = 2.0 - step / 100
    assert steps == list(range(40, 100))  # the loop's own (0-based) step indices: the training is unchanged
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 60 and lines[0].startswith("train: step 41/100, loss 1.6, ") and lines[-1].startswith("train: step 100/100, loss 1.01, ")
    assert all(" step/s, elapsed 0:00:0" in line and ", ETA " in line for line in lines)


def test_plain_lines_are_few_and_other_ranks_print_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    bar = TrainProgress(ctx(), 0, 500, tty=False)
    for _ in bar:
        bar.loss = 0.5
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: step 500/500, loss 0.5, ")  # one every ~10 s, and the last step's
    for _ in TrainProgress(ctx(main=False), 0, 5, tty=False):
        pass
    assert capsys.readouterr().err == ""


def test_the_terminal_bar_shows_absolute_steps_and_the_loss() -> None:
    import io

    from rich.console import Console

    shown = io.StringIO()
    bar = TrainProgress(ctx(), 40, 100, tty=True, console=Console(file=shown, force_terminal=True, width=150))
    for step in bar:
        bar.loss = 0.25
    text = shown.getvalue()
    assert "100/100" in text and "loss 0.25" in text and "ETA" in text and "elapsed" in text and "60/60" not in text


@pytest.mark.slow
def test_a_real_run_resumed_at_step_2_of_4_reports_steps_3_and_4(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from mmcore.testing import StageCLI

    mm = StageCLI(tmp_path)
    args = ["run", "--pack", "whisper", "--preset", "tiny", "--run-dir", "r", "data.demo_samples=8", "training.steps=4", "training.checkpoint_every=2"]
    killed = mm(*args, check=False, MMCORE_TEST_KILL="train-step:2")  # killed after step 2's checkpoint
    assert killed.returncode != 0
    resumed = mm(*args)  # a log, not a terminal: plain lines
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("train: step")]
    assert len(lines) == 1 and lines[0].startswith("train: step 4/4, loss "), resumed.stderr  # not "2/2": steps 3 and 4 of 4
