"""Weights & Biases tracker (``logging.report_to: [wandb]``; ``pip install 'mmcore[wandb]'``).

One wandb run per run directory (its id in ``<run_dir>/trackers/wandb.json``; each stage that
logs resumes it): the config, as the run's config; every metric of every stage against that
stage's own step (``<stage>/step``, so train's steps and a later stage's never collide on wandb's
single increasing step); a finished stage's plot (``train.png``) as an image, the evaluate
stage's numbers in the run's summary, its ``metrics.json`` and ``report.html`` as an artifact.
Offline under ``run.offline`` (``logging.wandb_mode``, WANDB_MODE); the run's files go under the
run directory unless WANDB_DIR says elsewhere. Only the main process logs.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Iterator

from mmcore import hookimpl
from mmcore.framework.tracking import active, evaluate_results, finishing_files, flat_config, kept_rows, numbers, project, read_state, run_name, tracker_run

NAME = "wandb"

_runs: dict[str, Any] = {}  # stage folder -> the open wandb run
# stage folder -> the (metric, step) pairs wandb already holds from an interrupted attempt: it
# cannot delete history rows, so those are not logged again (each step once)
_held: dict[str, set[tuple[str, int]]] = {}


def _mode(ctx: Any) -> str | None:
    mode = ctx.config.logging.wandb_mode
    if mode is None and ctx.offline:
        mode = "offline"  # run.offline: never touch the network, whatever WANDB_MODE says
    return mode  # None: wandb reads WANDB_MODE itself, else online


def _dir(ctx: Any) -> str:
    return os.environ.get("WANDB_DIR") or str(ctx.run_dir)


def _open(ctx: Any) -> Any:
    key = str(ctx.stage_dir)
    if key in _runs:
        return _runs[key]
    import wandb

    state, _ = tracker_run(ctx, NAME)
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
        dir=_dir(ctx),
        mode=_mode(ctx),  # type: ignore[arg-type]
        # the run's config is one mapping, not a history: sent by every stage that resumes the run
        # (a kill may have lost the first stage's unwritten records, the config with them)
        config=flat_config(ctx.config),
        allow_val_change=True,
        reinit="create_new",  # a user's own wandb run in the same process stays theirs
        settings=settings,
    )
    run.define_metric(f"{ctx.stage}/step", hidden=True)
    run.define_metric(f"{ctx.stage}/*", step_metric=f"{ctx.stage}/step")
    _runs[key] = run
    return run


@hookimpl
def mmcore_stage_started(ctx):
    active(ctx, NAME)  # a run not started by the CLI: a missing package is said now, not at the first step


@hookimpl
def mmcore_log_metrics(ctx, step, metrics):
    if not active(ctx, NAME):
        return
    held = _held.get(str(ctx.stage_dir), set())
    values = {f"{ctx.stage}/{k}": v for k, v in numbers(metrics).items() if (f"{ctx.stage}/{k}", step) not in held}
    if values:
        _open(ctx).log({**values, f"{ctx.stage}/step": step})


@hookimpl
def mmcore_metrics_resumed(ctx, step):
    """What the interrupted attempt's wandb run holds, read from its local files (offline and
    online runs alike keep one): what was written is not logged twice; what a kill lost (wandb
    writes the file every 15 s) is logged again, up to ``step`` from ``metrics.jsonl``, after
    it by the resumed attempt."""
    if not active(ctx, NAME):
        return
    run_id = read_state(ctx, NAME).get("id")
    stage_step = f"{ctx.stage}/step"
    held = set()
    for path in Path(_dir(ctx)).glob(f"wandb/*-{run_id}/run-{run_id}.wandb") if run_id else ():
        for record in wandb_file_records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            # a key with a slash is stored split at the slashes
            row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            if stage_step in row:
                at = int(float(row[stage_step]))
                held.update((key, at) for key in row if key.startswith(f"{ctx.stage}/") and key != stage_step)
    _held[str(ctx.stage_dir)] = held
    for at, values in kept_rows(ctx, step):
        mmcore_log_metrics(ctx, at, values)


@hookimpl
def mmcore_stage_finished(ctx, manifest, error):
    files = finishing_files(ctx, NAME, manifest, _held, _runs)
    if files is None:
        return
    run = _open(ctx)
    try:
        import wandb

        if "train.png" in files:
            run.log({f"{ctx.stage}/plot": wandb.Image(str(files["train.png"]))})
        run.summary.update({f"{ctx.stage}/{k}": v for k, v in evaluate_results(files).items()})
        if manifest is not None:
            run.summary.update({f"{ctx.stage}/{k}": v for k, v in numbers(manifest.metrics).items()})
        results = [files[name] for name in ("metrics.json", "report.html") if name in files]
        if results:  # the files as they are now (run.save would link them, and warn so)
            artifact = wandb.Artifact(f"{ctx.stage}-results", type="results")
            for path in results:
                artifact.add_file(str(path))
            run.log_artifact(artifact)
    finally:
        _runs.pop(str(ctx.stage_dir), None)
        run.finish(exit_code=1 if error is not None else 0)


def wandb_file_records(path: Path) -> Iterator[Any]:
    """The records of a run's ``.wandb`` file (what `wandb sync` uploads): LevelDB's log format,
    32 KiB blocks of chunks, each record a wandb protobuf ``Record``. wandb 0.31 ships the
    messages but no Python reader (its Go core writes the file). A file a kill cut short ends
    at its last whole record."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if len(data) < 7 or struct.unpack("<4sHB", data[:7])[:2] != (b":W&B", 0xBEE1):
        return
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 or pos + 7 + length > len(data):
            return  # zeroes of an unwritten block, or a chunk cut short
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or the LAST of FIRST, MIDDLE..., LAST
            record = pb.Record()
            try:
                record.ParseFromString(pending)
            except DecodeError:
                return
            pending = b""
            yield record
