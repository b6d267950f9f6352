"""What a run directory promises a user who resumes, changes a setting, asks for status or
evaluates another file (docs/run-directory.md): the toy pack through the real CLI, and the train
engine killed for real (``MMCORE_TEST_KILL``) in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mmcore_helpers import CLI
from mmcore import PackSpec, StageResult
from mmcore.run.rundir import RunDir


def test_resume_refuses_a_finished_stage_whose_config_changed_naming_the_keys(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data))
    train = tmp_path / "runs/toy-tiny/train/manifest.json"
    finished = train.read_text()
    proc = cli("train", "--pack", "toy", "--data", str(line_data), "--resume", "training.lr=0.05", "training.steps=4", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: cannot resume 'train': it finished, and its config changed since: training.lr 0.1 -> 0.05; training.steps 6 -> 4 (hint: run it without --resume"), line
    assert train.read_text() == finished and not (tmp_path / "runs/toy-tiny/.train.replaced").exists()  # nothing was touched
    proc = cli("train", "--pack", "toy", "--data", str(line_data), "--resume")  # the same config: nothing to do
    assert "[train] skipped: up to date" in proc.stdout


def test_an_override_that_changes_a_finished_stage_says_so_and_keeps_it_until_the_new_one_finishes(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data))
    run = tmp_path / "runs/toy-tiny"
    finished = (run / "train/manifest.json").read_text()
    proc = cli("train", "--pack", "toy", "--data", str(line_data), "training.lr=0.05", check=False, TOY_DIE_AT_STEP="2")
    said = [line for line in proc.stdout.splitlines() if line.startswith("[train] running")]
    assert said == ["[train] running (its config changed: training.lr 0.1 -> 0.05); the finished train is kept as .train.replaced until this one finishes"], proc.stdout
    assert (run / ".train.replaced/manifest.json").read_text() == finished  # killed: the finished one is still there
    status = cli("status", "--run-dir", str(run)).stdout  # the run's config now says lr 0.05: its train was interrupted
    assert "train       todo  interrupted at step 2" in status, status
    proc = cli("train", "--run-dir", str(run), "training.lr=0.1")  # back to the finished config: it comes back
    assert "[train] restored the finished run of this config" in proc.stdout and (run / "train/manifest.json").read_text() == finished
    proc = cli("train", "--run-dir", str(run), "training.lr=0.05")  # the new one finishes: the old one goes
    assert "kept as .train.replaced" in proc.stdout and not (run / ".train.replaced").exists()
    assert RunDir(run).read_manifest("train").config["training"]["lr"] == 0.05


def test_status_says_where_a_killed_training_stopped_and_its_newest_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    overrides = ["training.steps=10", "training.checkpoint_every=2"]
    script = "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); from test_training_guards import train; train(Path(sys.argv[2]), *sys.argv[3:])"
    env = dict(os.environ, MMCORE_TEST_KILL="train-step:5")  # killed after step 5, its last checkpoint step 4
    proc = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), str(run), *overrides], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    from mmcore.testing import make_runner, plugins_with
    from test_training_guards import PACK

    runner = make_runner(plugins_with(PACK), "linear", run, overrides=["training.lr_schedule=constant", "training.checkpoint_every=1", *overrides])
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    # the rows up to the checkpoint were written before it; step 5's within the second after (mmcore.train.metric_log)
    assert [r["step"] for r in rows][:4] == [1, 2, 3, 4] and rows[-1]["step"] in (4, 5), rows
    assert runner.freshness("train", runner.plan("train", runner.upstream("train"))) == (False, f"interrupted at step {rows[-1]['step']} (checkpoint 4)")


def download(ctx, upstream):  # type: ignore[no-untyped-def]
    (ctx.stage_dir / "model.json").write_text('{"w": 2}')
    return StageResult(outputs={"model": "model.json"})


def evaluate(ctx, upstream):  # type: ignore[no-untyped-def]
    """Scores each held-out line (default: a built-in split) as an evaluate stage does."""
    files = ctx.config.evaluate.datasets
    items = [line for f in files for line in Path(f).read_text().splitlines()] if files else ["held-out 0", "held-out 1"]
    for f in files:
        ctx.record_input(f)
    (ctx.stage_dir / "results.jsonl").write_text("".join(json.dumps({"item": item}) + "\n" for item in items))
    return StageResult(outputs={"results": "results.jsonl"}, metrics={"items": len(items)})


HELD = PackSpec(name="held", stages={"download": "test_run_promises:download", "evaluate": "test_run_promises:evaluate"})


def test_eval_on_a_file_writes_its_own_folder_and_leaves_the_runs_evaluation_done(tmp_path: Path) -> None:
    from mmcore.engines.evaluation import evaluate_files
    from mmcore.testing import make_runner, plugins_with

    run = tmp_path / "run"
    runner = make_runner(plugins_with(HELD), "held", run)
    runner.run_pipeline()
    own, config = (run / "evaluate/manifest.json").read_text(), (run / "config.yaml").read_text()
    mine = tmp_path / "my data.jsonl"
    mine.write_text("a\nb\nc\n")
    manifest = evaluate_files(runner, [str(mine)])
    assert manifest.stage_dir == run / "evaluate-my-data" and manifest.metrics == {"items": 3}
    assert [json.loads(x)["item"] for x in (run / "evaluate-my-data/results.jsonl").read_text().splitlines()] == ["a", "b", "c"]
    assert (run / "evaluate/manifest.json").read_text() == own and (run / "config.yaml").read_text() == config
    plan = runner.plan("evaluate", runner.upstream("evaluate"))
    assert runner.freshness("evaluate", plan)[0]  # `mmcore status`: the run's evaluate is still done
    again = evaluate_files(runner, [str(mine)])  # the same file and model: up to date, not run again
    assert again.finished_at == manifest.finished_at
    mine.write_text("a\n")  # its content changed: evaluated again, in the same folder
    assert evaluate_files(runner, [str(mine)]).metrics == {"items": 1} and not (run / ".evaluate-my-data.replaced").exists()
