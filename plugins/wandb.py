"""Weights & Biases tracker (``logging.report_to: [wandb]``; ``pip install 'mmcore[wandb]'``).

One wandb run per run directory (its id in ``<run_dir>/trackers/wandb.json``; each stage that
logs resumes it): the config once, as the run's config; every metric of every stage against that
stage's own step (``<stage>/step``, so train's steps and a later stage's never collide on wandb's
single increasing step); a finished stage's plot (``train.png``) as an image, the evaluate
stage's numbers in the run's summary, its ``metrics.json`` and ``report.html`` saved with the run.
Offline under ``run.offline`` (``logging.wandb_mode``, WANDB_MODE); the run's files go under the
run directory unless WANDB_DIR says elsewhere. Only the main process logs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mmcore import hookimpl
from mmcore.tracking import active, evaluate_results, flat_config, logged_through, numbers, project, run_name, stage_files, tracker_run

NAME = "wandb"

_runs: dict[str, Any] = {}  # stage folder -> the open wandb run
# stage folder -> the last step the interrupted attempt logged: wandb cannot delete history rows,
# so after a resume only later steps are logged (each step once, from its first attempt)
_skip_through: dict[str, int] = {}


def _mode(ctx: Any) -> str | None:
    mode = ctx.config.logging.wandb_mode
    if mode is None and ctx.offline:
        mode = "offline"  # run.offline: never touch the network, whatever WANDB_MODE says
    return mode  # None: wandb reads WANDB_MODE itself, else online


def _open(ctx: Any) -> Any:
    key = str(ctx.stage_dir)
    if key in _runs:
        return _runs[key]
    import wandb

    state, fresh = tracker_run(ctx, NAME)
    settings = wandb.Settings(
        console="off",  # mmcore's output stays the terminal's: no wrapped stdout/stderr
        x_disable_stats=True,  # no sampling thread of CPU/GPU use in the train loop's process
        silent=True,
    )
    run = wandb.init(
        project=project(ctx, "WANDB_PROJECT"),
        name=run_name(ctx),
        id=state["id"],
        resume="allow",
        dir=os.environ.get("WANDB_DIR") or str(ctx.run_dir),
        mode=_mode(ctx),  # type: ignore[arg-type]
        config=flat_config(ctx.config) if fresh else None,  # once: a resumed run has it
        allow_val_change=True,
        reinit="create_new",  # a user's own wandb run in the same process stays theirs
        settings=settings,
    )
    run.define_metric(f"{ctx.stage}/step", hidden=True)
    run.define_metric(f"{ctx.stage}/*", step_metric=f"{ctx.stage}/step")
    _runs[key] = run
    return run


@hookimpl(trylast=True)  # after metrics.jsonl has the step: the record a resume reads
def mmcore_log_metrics(ctx, step, metrics):
    if not active(ctx, NAME) or step <= _skip_through.get(str(ctx.stage_dir), -1):
        return
    values = {f"{ctx.stage}/{k}": v for k, v in numbers(metrics).items()}
    if values:
        _open(ctx).log({**values, f"{ctx.stage}/step": step})


@hookimpl(tryfirst=True)  # before the events plugin cuts metrics.jsonl back to the checkpoint
def mmcore_metrics_resumed(ctx, step):
    if not active(ctx, NAME):
        return
    last = logged_through(ctx)
    if last is not None and last > step:
        _skip_through[str(ctx.stage_dir)] = last


@hookimpl
def mmcore_stage_finished(ctx, manifest, error):
    if not active(ctx, NAME):
        return
    key = str(ctx.stage_dir)
    _skip_through.pop(key, None)
    files = stage_files(ctx, manifest)
    if key not in _runs and not files:
        return  # a stage that logged nothing (download, convert...): no run to resume
    run = _open(ctx)
    try:
        import wandb

        if "train.png" in files:
            run.log({f"{ctx.stage}/plot": wandb.Image(str(files["train.png"]))})
        run.summary.update({f"{ctx.stage}/{k}": v for k, v in evaluate_results(files).items()})
        if manifest is not None:
            run.summary.update({f"{ctx.stage}/{k}": v for k, v in numbers(manifest.metrics).items()})
        for name in ("metrics.json", "report.html"):
            if name in files:
                run.save(str(files[name]), base_path=str(Path(ctx.stage_dir).parent), policy="now")
    finally:
        _runs.pop(key, None)
        run.finish(exit_code=1 if error is not None else 0)
