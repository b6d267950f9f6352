"""The stage runner: manifests, skipping what is up to date, resuming, crashes, distributed launch."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mmcore_helpers import CLI
from mmcore import PackSpec, StageResult, hookimpl
from mmcore.errors import StageError, UsageError
from mmcore.run.rundir import RunDir
from mmcore.testing import make_runner, plugins_with


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "train" / "losses.jsonl").read_text().splitlines()]


def test_pipeline_writes_manifests_and_skips_absent_stages_visibly(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    proc = cli("run", "--pack", "toy", "--data", str(line_data))
    assert "[convert] skipped: the toy pack has no convert stage" in proc.stdout
    assert "[extract] skipped: the toy pack has no extract stage" in proc.stdout
    run = RunDir(tmp_path / "runs" / "toy-tiny")
    for stage in ("download", "preprocess", "train", "export"):
        m = run.read_manifest(stage)
        assert m is not None and m.status == "finished"
        assert m.versions["mmcore"] == "0.1.0" and m.versions["pack"] == "mm-pack-toy 0.3.0"
        assert not (run.stage_dir(stage) / ".started.json").exists()
    pre = run.read_manifest("preprocess")
    assert pre.inputs[str(line_data)]["sha256"]  # the dataset's content hash is recorded
    assert pre.config["data"]["datasets"] == [str(line_data)]
    assert run.read_manifest("train").upstream == {"download": run.read_manifest("download").fingerprint, "preprocess": pre.fingerprint}
    events = [json.loads(line)["event"] for line in (run.root / "events.jsonl").read_text().splitlines()]
    assert events.count("finished") == 4 and events.count("skipped") == 3  # convert, extract, evaluate
    metrics = (run.stage_dir("train") / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 6  # one line per step from ctx.log_metrics, through the events plugin


def test_unchanged_rerun_does_nothing_and_changes_rerun_only_what_depends_on_them(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data))
    run = RunDir(tmp_path / "runs" / "toy-tiny")
    finished = {s: run.read_manifest(s).finished_at for s in ("download", "preprocess", "train", "export")}

    proc = cli("run", "--pack", "toy", "--data", str(line_data))
    assert proc.stdout.count("up to date") == 4
    assert {s: run.read_manifest(s).finished_at for s in finished} == finished

    # A training setting: download and preprocess stay, train and export run again.
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "training.steps=3")
    assert "[download] skipped: up to date" in proc.stdout and "[preprocess] skipped: up to date" in proc.stdout
    assert "[train] running" in proc.stdout and "[export] running" in proc.stdout
    assert len(losses(run.root)) == 3

    # The dataset's content changes (same path): preprocess sees it, download does not.
    line_data.write_text('[{"x": 1, "y": 3}, {"x": 2, "y": 5}]')
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "training.steps=3")
    assert "[download] skipped: up to date" in proc.stdout
    assert f"[preprocess] running (input changed: {line_data})" in proc.stdout
    assert run.read_manifest("preprocess").metrics["kept"] == 2


def test_a_stage_never_consumes_an_unfinished_stage(cli: CLI, line_data: Path) -> None:
    cli("download", "--pack", "toy")
    proc = cli("train", "--pack", "toy", "--data", str(line_data), check=False)
    assert proc.returncode == 2
    assert "error: stage 'preprocess' has not finished" in proc.stderr and "mmcore preprocess" in proc.stderr


def test_killed_stage_leaves_no_manifest_and_run_redoes_it(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    proc = cli("run", "--pack", "toy", "--data", str(line_data), check=False, TOY_DIE_IN_PREPROCESS="1")
    assert proc.returncode != 0
    run = RunDir(tmp_path / "runs" / "toy-tiny")
    assert run.read_manifest("download") is not None
    assert run.read_manifest("preprocess") is None and run.read_started("preprocess") is not None
    status = cli("status", "--pack", "toy", "--data", str(line_data)).stdout
    assert "preprocess  todo  not finished yet" in status and "train       todo  after preprocess" in status
    proc = cli("run", "--pack", "toy", "--data", str(line_data))
    assert "[download] skipped: up to date" in proc.stdout and "[preprocess] resuming" in proc.stdout
    assert run.read_manifest("preprocess").metrics["kept"] == 4 and run.read_manifest("export") is not None


@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_killed_training_resumes_and_matches_an_uninterrupted_run(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "straight")
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "killed", check=False, TOY_DIE_AT_STEP="3")
    assert proc.returncode != 0 and RunDir(tmp_path / "killed").read_manifest("train") is None
    assert len(losses(tmp_path / "killed")) == 3
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "killed")
    assert "[train] resuming" in proc.stdout
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")
    assert (tmp_path / "killed/export/model.json").read_text() == (tmp_path / "straight/export/model.json").read_text()


def test_resume_refuses_when_the_config_changed(cli: CLI, line_data: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data), check=False, TOY_DIE_AT_STEP="2")
    proc = cli("train", "--pack", "toy", "--data", str(line_data), "--resume", "training.lr=0.05", check=False)
    assert proc.returncode == 2
    assert "error: cannot resume 'train'" in proc.stderr and "without --resume" in proc.stderr
    proc = cli("train", "--pack", "toy", "--data", str(line_data), "training.lr=0.05")
    assert "[train] running" in proc.stdout  # without --resume it starts afresh


@pytest.mark.slow
@pytest.mark.compares_runs
def test_two_processes_through_torchrun_match_one(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "one")
    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "two", "--nproc-per-node", "2")
    assert json.loads((tmp_path / "two/train/world.json").read_text()) == {"world_size": 2, "trust_remote_code": False}
    assert RunDir(tmp_path / "two").read_manifest("train").world_size == 2
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-12, abs=0)
    # the user's permission reaches the workers from the launching command (they never take it from config.yaml)
    cli("train", "--run-dir", "two", "--force", "model.trust_remote_code=true")
    assert json.loads((tmp_path / "two/train/world.json").read_text()) == {"world_size": 2, "trust_remote_code": True}


@pytest.mark.slow
@pytest.mark.compares_runs
def test_two_nodes_on_loopback_share_one_run_directory(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    """The README's way: the same `mmcore run` on each node, one shared run directory. Node 0
    runs the single-process stages and exports; node 1 waits for them and joins training; the
    losses are a 2-process single-node run's. (Node 1 is started first: it waits for node 0.)"""
    from mmcore.testing import run_nodes

    leader, follower = run_nodes(tmp_path, ["run", "--pack", "toy", "--data", str(line_data), "--run-dir", "shared"], order=(1, 0), timeout=300, env=cli.env())
    assert [leader.returncode, follower.returncode] == [0, 0], (leader, follower)
    assert "[preprocess] done by node 0" in follower.stdout and "[export] done by node 0" in follower.stdout, follower.stdout
    run = RunDir(tmp_path / "shared")
    assert run.read_manifest("train").world_size == 2 and run.read_manifest("export") is not None
    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "two", "--nproc-per-node", "2")
    assert losses(tmp_path / "shared") == pytest.approx(losses(tmp_path / "two"), rel=1e-12, abs=0)


def test_a_following_node_stops_when_node_0_goes_silent(tmp_path: Path) -> None:
    """Node 0's heartbeat, read by the shared file system's clock: a follower waiting for a
    stage does not wait forever for a node 0 that died."""
    import os

    class Slow:
        PACK = PackSpec(name="slow")

        @hookimpl
        def mmcore_download(self, ctx):
            return StageResult(outputs={"model": "."})

    overrides = ["parallel.nnodes=2", "parallel.node_rank=1", "parallel.rdzv_endpoint=127.0.0.1:29999", "parallel.rdzv_timeout_s=5"]
    runner = make_runner(plugins_with(Slow()), "slow", tmp_path / "run", overrides=overrides)
    alive = tmp_path / "run/.nodes/node-0.alive"
    alive.parent.mkdir(parents=True)
    alive.touch()
    past = alive.stat().st_mtime - 60
    os.utime(alive, (past, past))  # its last beat a minute ago
    with pytest.raises(StageError, match=r"node 0 has given no sign of life in .* for 6\d s \(parallel.rdzv_timeout_s=5\) while this node waited for its 'download' stage"):
        runner.run_stage("download")


@pytest.mark.parametrize("node0_wrote", ["a temporary run.json", "run.json but not yet config.yaml"])
def test_a_following_node_started_while_node_0_writes_the_run_directory_waits_for_it(cli: CLI, line_data: Path, tmp_path: Path, node0_wrote: str) -> None:
    """Every node starts at once: a follower that looks at the run directory while node 0 is
    still writing run.json (its temporary file) and config.yaml must wait for node 0's
    announcement, not judge the half-written directory (CI saw node 1 stop at once with node 0
    left waiting at the rendezvous)."""
    run = tmp_path / "shared"
    run.mkdir()
    (run / ".lock").touch()
    if node0_wrote == "a temporary run.json":
        (run / ".run.json.x1y2.tmp").write_text("{")
    else:
        (run / "run.json").write_text(json.dumps({"pack": "toy", "preset": None, "config_file": None, "overrides": [], "created_at": 0}))
    proc = cli(
        "run", "--pack", "toy", "--data", str(line_data), "--run-dir", "shared", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29999", "parallel.rdzv_timeout_s=2", check=False
    )
    assert proc.returncode == 2
    assert "error: node 1: no sign of node 0 in" in proc.stderr, proc.stderr  # it waited (2 s) for the announcement


def test_a_node_that_does_not_see_node_0s_directory_stops_with_the_fix(cli: CLI, line_data: Path) -> None:
    proc = cli(
        "run", "--pack", "toy", "--data", str(line_data), "--run-dir", "elsewhere", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29999", "parallel.rdzv_timeout_s=2", check=False
    )
    assert proc.returncode == 2
    assert "error: node 1: no sign of node 0 in" in proc.stderr and "a file system all nodes share" in proc.stderr, proc.stderr


def test_stage_failure_is_one_line_with_the_traceback_saved(tmp_path: Path) -> None:
    class Broken:
        PACK = PackSpec(name="broken")

        @hookimpl
        def mmcore_download(self, ctx):
            raise ZeroDivisionError("the model\n  is empty")  # a library's message over two lines

    runner = make_runner(plugins_with(Broken()), "broken", tmp_path / "run")
    with pytest.raises(StageError, match=r"stage 'download' of pack 'broken' failed: ZeroDivisionError: the model is empty") as info:
        runner.run_stage("download")
    log = tmp_path / "run" / "download" / "error.log"
    assert str(log) in info.value.one_line() and "Traceback" in log.read_text()
    assert "\n" not in info.value.one_line()
    assert runner.run_dir.read_manifest("download") is None


def test_declined_stage_is_skipped_visibly_and_downstream_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Declines:
        PACK = PackSpec(name="declines")

        @hookimpl
        def mmcore_extract(self, ctx):
            return None  # e.g. no frozen encoder in this config

        @hookimpl
        def mmcore_train(self, ctx, upstream):
            assert "extract" not in upstream
            return StageResult(outputs={"checkpoint": "."}, metrics={"ok": 1})

    runner = make_runner(plugins_with(Declines()), "declines", tmp_path / "run")
    runner.run_pipeline()
    out = capsys.readouterr().out
    assert "[extract] skipped: declined by the declines pack" in out
    assert runner.run_dir.read_manifest("extract").status == "declined"
    assert runner.run_dir.read_manifest("train").metrics == {"ok": 1}
    # Same config, same upstream: the pack would decline again, so status and reruns say done.
    upstream = runner.upstream("extract")
    assert runner.freshness("extract", runner.plan("extract", upstream)) == (True, "declined by the declines pack for this config")
    runner.run_pipeline()
    assert "[extract] skipped: declined by the declines pack for this config" in capsys.readouterr().out


def test_a_stage_redone_with_other_output_reruns_what_follows_and_with_the_same_output_does_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``mmcore download --force`` after the pack's init code changed (same config, same plan):
    the next run must not train on what was extracted from the old model."""
    written = {"weights": "v1"}

    class Redone:
        PACK = PackSpec(name="redone")

        @hookimpl
        def mmcore_download(self, ctx):
            (ctx.stage_dir / "model.txt").write_text(written["weights"])
            return StageResult(outputs={"model": "model.txt"})

        @hookimpl
        def mmcore_extract(self, ctx, upstream):
            (ctx.stage_dir / "features.txt").write_text(upstream["download"].output("model").read_text())
            return StageResult(outputs={"features": "features.txt"})

    runner = make_runner(plugins_with(Redone()), "redone", tmp_path / "run")
    runner.run_pipeline()
    runner.run_stage("download", force=True)  # the same bytes again
    runner.run_pipeline()
    assert "[extract] skipped: up to date" in capsys.readouterr().out
    written["weights"] = "v2"
    runner.run_stage("download", force=True)
    runner.run_pipeline()
    assert "[extract] skipped" not in capsys.readouterr().out
    assert (tmp_path / "run/extract/features.txt").read_text() == "v2"


def test_a_stage_returning_the_wrong_type_is_named(tmp_path: Path) -> None:
    class Wrong:
        PACK = PackSpec(name="wrong")

        @hookimpl
        def mmcore_download(self, ctx):
            return {"outputs": {}}

    runner = make_runner(plugins_with(Wrong()), "wrong", tmp_path / "run")
    with pytest.raises(StageError, match="returned dict, not mmcore.StageResult"):
        runner.run_stage("download")


def test_run_directory_is_locked_against_a_second_process(tmp_path: Path) -> None:
    held = RunDir(tmp_path)
    held.lock()
    import subprocess
    import sys

    code = f"from mmcore.run.rundir import RunDir\nRunDir({str(tmp_path)!r}).lock()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "is in use by another mmcore process" in proc.stderr
    del held  # closing the handle releases the lock
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_unknown_stage_for_pack(toy_pack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runner = make_runner(plugins_with(toy_pack), "toy", tmp_path / "run")
    with pytest.raises(UsageError, match="the toy pack has no convert stage"):
        runner.run_stage("convert")


@pytest.mark.slow
def test_a_stalled_rank_ends_the_run_in_bounded_time_with_one_line(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    """Rank 1 stops mid-training, alive and silent (a hung process): rank 0's next collective
    gives up after parallel.collective_timeout_s, says so in one line naming itself and the
    stage, and torchrun ends the silent one: the run fails within seconds of the timeout."""
    import time

    start = time.monotonic()
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "stall", "--nproc-per-node", "2", "parallel.collective_timeout_s=5", check=False, MMCORE_TEST_STALL="train-step:2@1")
    took = time.monotonic() - start
    assert proc.returncode != 0 and took < 120, (took, proc.stderr)
    line = next(x for x in proc.stderr.splitlines() if "collective_timeout_s" in x)
    # said once, by the launching command (the stalled rank, killed by torchrun, says nothing)
    assert line.startswith("error: rank 0 waited parallel.collective_timeout_s=5 s in stage 'train' for the other processes"), line
    assert "(rank 0 of 2)" in line and len([x for x in proc.stderr.splitlines() if x.startswith("error")]) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_a_failed_two_node_attempt_ends_in_time_and_a_plain_rerun_restores_the_finished_training(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    """Issue 49: node 0 of a two-node run whose peer never came waited 800 s past
    parallel.rdzv_timeout_s=30 (torchrun's static rendezvous reads "timeout", not
    "join_timeout"); parallel.nnodes=2 then stuck in the run's config.yaml, so a plain rerun hung
    again, and --nnodes 1 retrained instead of restoring the training the attempt had set aside."""
    from mmcore.run.launch import free_port

    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "r")
    trained = (tmp_path / "r" / "train" / "manifest.json").read_text()
    start = time.monotonic()
    proc = cli("run", "--run-dir", "r", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "parallel.rdzv_timeout_s=5", check=False)
    waited = time.monotonic() - start
    assert proc.returncode == 1 and "[train] running (its config changed: parallel.data_parallel_replicas 1 -> 2)" in proc.stdout, proc.stdout + proc.stderr
    assert waited < 120, f"node 0 waited {waited:.0f} s for a peer, parallel.rdzv_timeout_s=5"  # torchrun's own default is 600 s
    assert (tmp_path / "r" / ".train.replaced").is_dir()
    proc = cli("run", "--run-dir", "r")  # no launch options: one node, as before the attempt
    assert "[train] restored the finished run of this config" in proc.stdout, proc.stdout
    assert (tmp_path / "r" / "train" / "manifest.json").read_text() == trained
    assert "nnodes: 1" in (tmp_path / "r" / "config.yaml").read_text()
