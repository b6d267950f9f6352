"""Experiment trackers (logging.report_to): real wandb (offline) and MLflow (the run directory's
own SQLite store) beside TensorBoard, read back with the trackers' own formats and clients."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mmcore_helpers import CLI

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

DETERMINISTIC = ("loss", "lr", "grad_norm", "eval/wer")  # the same in a resumed attempt; timings are not


# ------------------------------------------------------------------ reading what the trackers hold


def wandb_run(wandb_dir: Path) -> dict[str, Any]:
    """Every offline segment of the one wandb run under ``wandb_dir`` (each stage, each attempt
    resumes it): its ids, config, history rows and summary."""
    from mmcore_plugins.wandb import wandb_file_records

    files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert files, f"no offline wandb run under {wandb_dir}"
    ids, config, rows, summary, artifacts = set(), {}, [], {}, []
    for path in files:
        for record in wandb_file_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
            elif kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
            elif kind == "artifact":
                artifacts.append((record.artifact.name, sorted(entry.path for entry in record.artifact.manifest.contents)))
            elif kind == "summary":
                summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.summary.update})
    return {"ids": ids, "config": config, "rows": rows, "summary": summary, "artifacts": artifacts}


def mlflow_run(run_dir: Path) -> tuple[Any, Any]:
    """(client, the one MLflow run) of the run directory's own store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mmcore").experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return client, runs[0]


def jsonl_steps(run_dir: Path, stage: str = "train") -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] of ``metrics.jsonl``: what every sink was handed."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / stage / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key not in ("step", "time") and isinstance(value, (int, float)):
                out.setdefault(key, []).append((row["step"], value))
    return out


# ------------------------------------------------------------------ a real run, killed and resumed

OVERRIDES = ["data.demo_samples=4", "training.steps=4", "training.checkpoint_every=2", "logging.report_to=[tensorboard,wandb,mlflow]"]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Whisper's tiny pipeline with every tracker, killed after step 3 (last checkpoint: step 2),
    then run again: it resumes from step 2 and logs step 3 a second time."""
    from mmcore.testing.crash import run_args, run_mmcore

    work = tmp_path_factory.mktemp("trackers")
    run, wandb_dir = work / "run", work / "wandb-dir"
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "MLFLOW_TRACKING_URI": "", "HF_HUB_OFFLINE": "1"}
    wandb_dir.mkdir()
    proc = run_mmcore(work, run_args("whisper", "tiny", run, OVERRIDES), {**env, "MMCORE_TEST_KILL": "train-step:3"}, 900)
    assert proc.returncode != 0 and "loss" in (run / "train/metrics.jsonl").read_text(), proc.stdout + proc.stderr
    proc = run_mmcore(work, run_args("whisper", "tiny", run, OVERRIDES), env, 900)
    assert proc.returncode == 0 and "resumed from step 2" in proc.stdout, proc.stdout + proc.stderr
    return run, wandb_dir


def test_wandb_holds_each_step_once_after_a_resume_with_the_config_plot_and_evaluate_results(resumed_run: tuple[Path, Path]) -> None:
    run, wandb_dir = resumed_run
    logged = wandb_run(wandb_dir)
    assert len(logged["ids"]) == 1  # train's attempts and evaluate: one wandb run
    assert logged["config"]["training.steps"] == 4 and logged["config"]["logging.report_to"] == ["tensorboard", "wandb", "mlflow"]
    expected = jsonl_steps(run)
    assert [step for step, _ in expected["loss"]] == [1, 2, 3, 4]
    for key, points in expected.items():
        held = [(row["train/step"], row[f"train/{key}"]) for row in logged["rows"] if f"train/{key}" in row]
        assert sorted(s for s, _ in held) == [s for s, _ in points], key  # each step once (a kill's losses logged again)
        if key in DETERMINISTIC:
            assert sorted(held) == points, key
    assert any(row.get("train/plot/_type") == "image-file" for row in logged["rows"])  # train.png
    results = json.loads((run / "evaluate/metrics.json").read_text())
    assert logged["summary"]["evaluate/wer"] == results["wer"] and "evaluate/cer" in logged["summary"]
    assert logged["summary"]["train/final_loss"] == expected["loss"][-1][1]
    assert ("evaluate-results", ["metrics.json", "report.html"]) in logged["artifacts"]


def test_mlflow_holds_each_step_once_after_a_resume_with_the_config_plot_and_evaluate_results(resumed_run: tuple[Path, Path]) -> None:
    run, _ = resumed_run
    client, mlrun = mlflow_run(run)
    assert mlrun.info.status == "FINISHED" and mlrun.info.run_name == "run"
    assert mlrun.data.params["training.steps"] == "4" and mlrun.data.params["run.seed"] == "0"
    for key, points in jsonl_steps(run).items():
        held = sorted((m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, f"train/{key}"))
        assert [s for s, _ in held] == [s for s, _ in points], key
        if key in DETERMINISTIC:
            assert held == points, key
    results = json.loads((run / "evaluate/metrics.json").read_text())
    assert mlrun.data.metrics["evaluate/wer"] == results["wer"]
    artifacts = {a.path for folder in ("train", "evaluate") for a in client.list_artifacts(mlrun.info.run_id, folder)}
    assert {"train/train.png", "evaluate/metrics.json", "evaluate/report.html"} <= artifacts


def test_tensorboard_beside_them_holds_each_step_once(resumed_run: tuple[Path, Path]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = resumed_run
    board = EventAccumulator(str(run / "train/tensorboard"))
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("train/loss")] == [(s, pytest.approx(v, rel=1e-6)) for s, v in jsonl_steps(run)["loss"]]


# ------------------------------------------------------------------ the toy pack: choosing, refusing


def test_report_to_chooses_the_trackers_and_a_rerun_afresh_is_a_new_mlflow_run(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "r", "logging.report_to=mlflow", MLFLOW_TRACKING_URI="")
    run = tmp_path / "r"
    assert not (run / "train/tensorboard").exists()  # not named: TensorBoard is not loaded
    losses = [(json.loads(line)["step"], json.loads(line)["loss"]) for line in (run / "train/losses.jsonl").read_text().splitlines()]
    client, first = mlflow_run(run)
    assert sorted((m.step, m.value) for m in client.get_metric_history(first.info.run_id, "train/loss")) == losses
    # another training config reruns train from scratch: its steps go to a new MLflow run, not
    # on top of the first run's
    cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "r", "logging.report_to=mlflow", "training.steps=3", MLFLOW_TRACKING_URI="")
    runs = client.search_runs([client.get_experiment_by_name("mmcore").experiment_id], order_by=["attributes.start_time ASC"])
    assert len(runs) == 2 and [m.step for m in client.get_metric_history(runs[1].info.run_id, "train/loss")] == [1, 2, 3]
    assert runs[1].data.params["training.steps"] == "3"


BLOCKER = """
    # Make packages absent for this interpreter, as if never installed: the path finder no longer
    # sees them (importlib.util.find_spec gives None, import raises ModuleNotFoundError).
    import importlib.machinery, os
    _hidden = set(os.environ.get("HIDE_PACKAGES", "").split(","))
    _find = importlib.machinery.PathFinder.find_spec.__func__

    def _find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in _hidden:
            return None
        return _find(cls, name, path, target)

    importlib.machinery.PathFinder.find_spec = classmethod(_find_spec)
"""


@pytest.mark.parametrize("tracker, package, extra", [("wandb", "wandb", "wandb"), ("mlflow", "mlflow-skinny", "mlflow")])
def test_a_tracker_not_installed_is_one_line_before_any_stage_runs(cli: CLI, line_data: Path, tmp_path: Path, tracker: str, package: str, extra: str) -> None:
    site = tmp_path / "hide"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(BLOCKER))
    cli.sites.append(site)
    proc = cli("run", "--pack", "toy", "--data", str(line_data), "--run-dir", "r", f"logging.report_to=[tensorboard,{tracker}]", check=False, HIDE_PACKAGES=tracker.split("-")[0])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: logging.report_to names {tracker}, but the {package} package is not installed (hint: pip install 'mmcore[{extra}]', or leave {tracker} out of logging.report_to)"
    ]
    assert "[download]" not in proc.stdout and not (tmp_path / "r/download").exists()


def test_the_logging_section_reads_one_or_none_and_refuses_an_unknown_tracker() -> None:
    from mmcore.config import Layer, RunConfig, build_config, overrides_layer
    from mmcore.errors import ConfigError

    assert RunConfig().logging.report_to == ["tensorboard"]  # today's runs: unchanged
    assert build_config(RunConfig, [overrides_layer(["logging.report_to=wandb"])]).logging.report_to == ["wandb"]
    assert build_config(RunConfig, [overrides_layer(["logging.report_to=none"])]).logging.report_to == []
    assert build_config(RunConfig, [Layer("a.yaml", {"logging": {"report_to": ["mlflow", "mlflow"]}})]).logging.report_to == ["mlflow"]
    with pytest.raises(ConfigError) as err:
        build_config(RunConfig, [overrides_layer(["logging.report_to=[wandb,comet]"])])
    assert str(err.value).startswith("command line: logging.report_to.1: Input should be 'tensorboard', 'wandb' or 'mlflow'")
    assert "\n" not in str(err.value)
    # the section is no stage's input: turning a tracker on reruns nothing
    assert all("logging" not in part for part in RunConfig().slice(("training", "data", "model")))


def test_only_rank_0_of_a_distributed_stage_logs(cli: CLI, line_data: Path, tmp_path: Path) -> None:
    """Two torchrun workers run train; each step is in wandb and MLflow once (from rank 0), in
    the same tracker runs as the stages the launching process ran."""
    cli(
        "run",
        "--pack",
        "toy",
        "--data",
        str(line_data),
        "--run-dir",
        "r",
        "--nproc-per-node",
        "2",
        "logging.report_to=[wandb,mlflow]",
        MLFLOW_TRACKING_URI="",
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path),
    )
    run = tmp_path / "r"
    steps = [step for step, _ in jsonl_steps(run)["loss"]]
    assert steps == [1, 2, 3, 4, 5, 6]
    client, mlrun = mlflow_run(run)
    assert [m.step for m in client.get_metric_history(mlrun.info.run_id, "train/loss")] == steps
    logged = wandb_run(tmp_path)
    assert len(logged["ids"]) == 1 and sorted(row["train/step"] for row in logged["rows"] if "train/loss" in row) == steps
