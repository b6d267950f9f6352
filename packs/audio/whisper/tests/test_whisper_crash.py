"""Crash points of every stage on one pack (whisper: it has all six stages and is the quickest):
a run killed at each in turn, every rerun resuming what the kill left, ends bit-identical to an
uninterrupted run. ``make crash-matrix`` runs each point separately on every pack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.testing.crash import crash_chain, declined_stages, differences, losses, points_for, process_group_trial, run_args, run_mmcore, straight_run

OVERRIDES = ["data.demo_samples=4", "training.steps=4", "training.checkpoint_every=1"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("crash")
    straight_run(work, "whisper", "tiny", work / "straight", OVERRIDES)
    return work / "straight"


@pytest.mark.compares_runs
def test_a_run_killed_at_every_crash_point_in_turn_loses_nothing(straight: Path) -> None:
    from mmcore.framework.plugins import Plugins

    points = points_for(Plugins.load().implemented_stages("whisper"), steps=4, declined=declined_stages(straight))
    assert len(points) >= 20 and {"checkpoint-write:4", "train-done", "safetensors-tensor", "convert-tensor:2"} <= set(points)
    resumed = straight.parent / "chain"
    crash_chain(straight.parent, "whisper", "tiny", resumed, OVERRIDES, points)
    assert differences(straight, resumed) == []
    assert json.loads((resumed / "train" / "manifest.json").read_text())["metrics"]["final_loss"] == json.loads((straight / "train" / "manifest.json").read_text())["metrics"]["final_loss"]


@pytest.mark.compares_runs
def test_the_final_checkpoint_is_never_deleted_to_be_rewritten(straight: Path) -> None:
    """Issue 19's run that could never resume: killed after the final checkpoint, resumed, and
    killed again while (formerly) that checkpoint was deleted and rewritten."""
    run = straight.parent / "final"
    proc = run_mmcore(straight.parent, run_args("whisper", "tiny", run, OVERRIDES), {"MMCORE_TEST_KILL": "train-done"}, 900)
    assert proc.returncode != 0 and (run / "train" / "checkpoints" / "step-00000004" / "trainer_state.json").is_file()
    # The last step's checkpoint is complete: the resumed run keeps it, so the kill point inside
    # a checkpoint write is never reached, and the final loss is the uninterrupted one.
    proc = run_mmcore(straight.parent, ["train", "--run-dir", str(run), "--resume"], {"MMCORE_TEST_KILL": "checkpoint-write:4"}, 900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from step 4" in proc.stdout
    train = json.loads((run / "train" / "manifest.json").read_text())
    assert train["metrics"]["final_loss"] == json.loads((straight / "train" / "manifest.json").read_text())["metrics"]["final_loss"]
    assert losses(run) == losses(straight)


TWO_PROCESSES = [*OVERRIDES, "parallel.nproc_per_node=2", "training.micro_batch_size=1"]


@pytest.mark.compares_runs
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the run's processes in Linux's /proc")
def test_a_killed_process_group_leaves_no_worker_and_an_immediate_rerun_loses_nothing(tmp_path: Path) -> None:
    """Issue 49: torchrun's workers live in sessions of their own, so a kill of ``mmcore run``'s
    process group (a terminal, a scheduler) left them training into the run directory while an
    immediate rerun resumed it. Rank 0 stalls after step 2's checkpoint (so the kill lands in
    training, whatever the machine's speed); the group is killed; the rerun starts at once."""
    straight_run(tmp_path, "whisper", "tiny", tmp_path / "straight", TWO_PROCESSES)
    assert process_group_trial(tmp_path, "whisper", "tiny", tmp_path / "straight", tmp_path / "killed", TWO_PROCESSES) == []


@pytest.mark.compares_runs
def test_a_run_killed_between_checkpoints_logs_each_step_once(straight: Path) -> None:
    """Issue 42: killed after step 3 with the last checkpoint at step 2, the resumed run logs step
    3 again; metrics.jsonl held it twice. (TensorBoard's own reader drops steps that go back in a
    new events file; the sink also writes purge_step, for readers that do not.)"""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = straight.parent / "between"
    every_two = [*OVERRIDES, "training.checkpoint_every=2"]
    proc = run_mmcore(straight.parent, run_args("whisper", "tiny", run, every_two), {"MMCORE_TEST_KILL": "train-step:3"}, 900)
    # the rows reach the file before each checkpoint (step 2's); step 3's only if its burst went out
    # before the kill (mmcore.train.metric_log: at most a second apart): then the resume must not
    # log it twice
    logged = [json.loads(line)["step"] for line in (run / "train/metrics.jsonl").read_text().splitlines() if "loss" in json.loads(line)]
    assert proc.returncode != 0 and logged in ([1, 2], [1, 2, 3]), logged
    proc = run_mmcore(straight.parent, run_args("whisper", "tiny", run, every_two), {}, 900)
    assert proc.returncode == 0 and "resumed from step 2" in proc.stdout, proc.stdout + proc.stderr
    steps = [json.loads(line)["step"] for line in (run / "train/metrics.jsonl").read_text().splitlines() if "loss" in json.loads(line)]
    assert steps == [1, 2, 3, 4]
    assert losses(run) == losses(straight)
    board = EventAccumulator(str(run / "train/tensorboard"))
    board.Reload()
    assert [event.step for event in board.Scalars("train/loss")] == [1, 2, 3, 4]
