"""The workers' errors are said once by the launching command (issue 49: the same line once
per rank between torchrun's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.errors import StageError
from mmcore.run.worker_errors import ERRORS_ENV, WorkerError, collected, report


def test_the_same_error_on_every_rank_is_one_line_with_the_workers_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ERRORS_ENV, str(tmp_path))
    for rank in (1, 0):
        report(rank, "training.lora.r: 9 is more than layer q is wide", "use at most 4", 2)
    error = collected(tmp_path, 2, "stage 'train'", 2, None)
    assert isinstance(error, WorkerError) and error.exit_code == 2
    assert error.one_line() == "training.lora.r: 9 is more than layer q is wide (ranks 0, 1 of 2) (hint: use at most 4)"
    assert capsys.readouterr().err == ""


def test_different_errors_are_each_said_once_naming_their_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ERRORS_ENV, str(tmp_path))
    report(0, "lost another process", None, 1)
    report(2, "lost another process", None, 1)
    report(1, "OSError: disk", None, 1)
    error = collected(tmp_path, 4, "stage 'train'", 1, None)
    assert isinstance(error, StageError) and "stage 'train' failed on 4 processes (torchrun exit code 1); see the workers' messages above" in error.one_line()
    assert capsys.readouterr().err.splitlines() == ["error (ranks 0, 2): lost another process", "error (rank 1): OSError: disk"]


def test_no_report_says_a_worker_was_killed(tmp_path: Path) -> None:
    assert "no worker said why" in collected(tmp_path, 2, "stage 'train'", 137, None).one_line()


def test_a_worker_started_by_hand_prints_its_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(ERRORS_ENV, raising=False)
    report(3, "bad", "fix it", 1)
    assert capsys.readouterr().err == "error (rank 3): bad (hint: fix it)\n"
