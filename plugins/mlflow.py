"""MLflow tracker (``logging.report_to: [mlflow]``; ``pip install 'mmcore[mlflow]'``).

One MLflow run per run directory (its id in ``<run_dir>/trackers/mlflow.json``): the config as
parameters once, when the run is created; every metric of every stage at its step, named
``<stage>/<metric>``; a finished stage's plot (``train.png``) and results (``metrics.json``,
``report.html``) as artifacts, the evaluate stage's numbers as ``evaluate/<metric>`` too. The
store defaults to a local one in the run directory, ``mlflow.db`` and ``mlflow-artifacts/``
(``logging.mlflow_tracking_uri``, MLFLOW_TRACKING_URI: another).
Only the main process logs. Through ``MlflowClient`` alone: no global active run to leak into
a user's own MLflow code in the same process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mmcore import hookimpl
from mmcore.framework.tracking import active, evaluate_results, finishing_files, flat_config, kept_rows, numbers, project, run_name, tracker_run, write_state

NAME = "mlflow"

# stage folder -> the open run: client and run id; and the (metric, step) pairs the store
# already holds from an interrupted attempt (MLflow cannot delete a metric's point: those are
# not logged again, so each step is in the history once)
_runs: dict[str, dict[str, Any]] = {}
_held: dict[str, set[tuple[str, int]]] = {}


def _tracking_uri(ctx: Any) -> str | None:
    """The configured store, else None: the run directory's own (MLflow 3.18 refuses a plain
    file store, ./mlruns, unless told to allow it; SQLite is its local default)."""
    return ctx.config.logging.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def _local_store(ctx: Any) -> tuple[str, str]:
    """(tracking URI, artifact location) inside the run directory: ``mlflow.db`` and
    ``mlflow-artifacts/`` (MLflow would put artifacts in ./mlruns of the working directory)."""
    root = Path(ctx.run_dir).absolute()
    return f"sqlite:///{root / 'mlflow.db'}", (root / "mlflow-artifacts").as_uri()


def _open(ctx: Any) -> dict[str, Any]:
    key = str(ctx.stage_dir)
    if key in _runs:
        return _runs[key]
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    uri, artifacts = _tracking_uri(ctx), None
    if uri is None:
        uri, artifacts = _local_store(ctx)
        import logging

        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables..." on every new run
    client = MlflowClient(tracking_uri=uri)
    state, fresh = tracker_run(ctx, NAME, where=uri)
    run_id = state.get("mlflow_run_id")
    if not fresh and run_id and _exists(client, run_id):
        client.update_run(run_id, status="RUNNING")
    else:  # a new run; or the store no longer has ours (deleted, another store at the same URI)
        name = project(ctx, "MLFLOW_EXPERIMENT_NAME")
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name, artifact_location=artifacts)
        run_id = client.create_run(experiment_id, run_name=run_name(ctx), tags={"mmcore.framework.pack": ctx.pack, "mmcore.run_dir": str(ctx.run_dir)}).info.run_id
        # the config once, as the run's parameters (MLflow refuses a parameter changing value)
        params = [Param(k, str(v)[:6000]) for k, v in flat_config(ctx.config).items()]
        client.log_batch(run_id, params=params)
        write_state(ctx, NAME, {**state, "mlflow_run_id": run_id})
    _runs[key] = {"client": client, "run_id": run_id}
    return _runs[key]


def _exists(client: Any, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        return False


@hookimpl
def mmcore_stage_started(ctx):
    active(ctx, NAME)  # a run not started by the CLI: a missing package is said now, not at the first step


@hookimpl
def mmcore_log_metrics(ctx, step, metrics, wall_time):
    if not active(ctx, NAME):
        return
    from mlflow.entities import Metric

    run = _open(ctx)
    held = _held.get(str(ctx.stage_dir), set())
    now = int(wall_time * 1000)
    batch = [Metric(f"{ctx.stage}/{k}", v, now, step) for k, v in numbers(metrics).items() if (f"{ctx.stage}/{k}", step) not in held]
    if batch:
        run["client"].log_batch(run["run_id"], metrics=batch)


@hookimpl
def mmcore_metrics_resumed(ctx, step):
    if not active(ctx, NAME):
        return
    run = _open(ctx)
    client, run_id = run["client"], run["run_id"]
    held = set()
    prefix = f"{ctx.stage}/"
    for key in client.get_run(run_id).data.metrics:
        if key.startswith(prefix):
            held.update((key, m.step) for m in client.get_metric_history(run_id, key))
    _held[str(ctx.stage_dir)] = held
    for at, values in kept_rows(ctx, step):  # what the store lacks of the kept steps (MLflow writes each at once: rarely any)
        mmcore_log_metrics(ctx, at, values, time.time())


@hookimpl
def mmcore_stage_finished(ctx, manifest, error):
    files = finishing_files(ctx, NAME, manifest, _held, _runs)
    if files is None:
        return
    run = _open(ctx)
    client, run_id = run["client"], run["run_id"]
    try:
        for path in files.values():
            client.log_artifact(run_id, str(path), artifact_path=ctx.stage)
        results = {f"{ctx.stage}/{k}": v for k, v in evaluate_results(files).items()}
        if results:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in results.items()])
    finally:
        _runs.pop(str(ctx.stage_dir), None)
        client.set_terminated(run_id, status="FAILED" if error is not None else "FINISHED")
