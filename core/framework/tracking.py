"""What the experiment-tracker plugins share (``logging.report_to``; docs/tracking.md).

Each tracker (``mmcore_plugins.tensorboard``, ``.wandb``, ``.mlflow``) is an observer plugin of
the metric hooks. One tracker run spans the whole run directory (train's curves and evaluate's
scores side by side); its id is kept in ``<run_dir>/trackers/<tracker>.json`` so that a resumed
or later stage, in this process or another (a torchrun worker), continues the same run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mmcore.errors import ConfigError


@dataclass(frozen=True)
class Tracker:
    modules: tuple[tuple[str, str], ...]  # (what `import` needs, the package pip installs for it)
    install: str  # the command that installs them all


TRACKERS = {
    "tensorboard": Tracker((("tensorboard", "tensorboard"),), "pip install tensorboard"),
    "wandb": Tracker((("wandb", "wandb"),), "pip install 'mmcore[wandb]'"),
    # mlflow-skinny is MLflow's client without the server's 50 packages; the run directory's
    # own store is SQLite, through SQLAlchemy and alembic (a full `pip install mlflow` has them)
    "mlflow": Tracker((("mlflow", "mlflow-skinny"), ("sqlalchemy", "sqlalchemy"), ("alembic", "alembic")), "pip install 'mmcore[mlflow]'"),
}

_missing: dict[str, str | None] = {}  # find_spec walks sys.path on every call: once per tracker


def missing_package(name: str) -> str | None:
    """The first package tracker ``name`` needs that is not installed, or None."""
    if name not in _missing:
        _missing[name] = next((package for module, package in TRACKERS[name].modules if importlib.util.find_spec(module) is None), None)
    return _missing[name]


def report_to(config: Any) -> list[str]:
    section = getattr(config, "logging", None)
    return list(section.report_to) if section is not None else ["tensorboard"]


def check_trackers(config: Any, plugins: Any = None) -> None:
    """Refuse, as one :class:`ConfigError` line, a tracker in ``logging.report_to`` that is not
    installed (or whose plugin did not load), before any stage spends time."""
    for name in report_to(config):
        missing = missing_package(name)
        if missing is not None:
            raise ConfigError(f"logging.report_to names {name}, but the {missing} package is not installed", hint=f"{TRACKERS[name].install}, or leave {name} out of logging.report_to")
        entry = plugins.plugins.get(name) if plugins is not None else None
        if entry is not None and not entry.ok:  # absent: MMCORE_DISABLE_PLUGINS left it out, on purpose
            raise ConfigError(f"logging.report_to names {name}, but its plugin ({entry.distribution}) is broken: {entry.error}")


def active(ctx: Any, name: str) -> bool:
    """Whether tracker ``name`` logs for this process: asked for, and the main process (the other
    ranks run the same hooks; one record per run). A missing package is a :class:`ConfigError`
    here, at a stage's start, for a run not started by the CLI (which refuses it before the first
    stage)."""
    if not ctx.world.is_main or name not in report_to(ctx.config):
        return False
    check_trackers(ctx.config)
    return True


# ------------------------------------------------------------------ the tracker run's identity


def _state_file(ctx: Any, name: str) -> Path:
    return Path(ctx.run_dir) / "trackers" / f"{name}.json"


def read_state(ctx: Any, name: str) -> dict[str, Any]:
    try:
        state = json.loads(_state_file(ctx, name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(ctx: Any, name: str, state: Mapping[str, Any]) -> None:
    from mmcore.framework.files import atomic_write_text

    path = _state_file(ctx, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(dict(state), indent=1) + "\n")


def tracker_run(ctx: Any, name: str, *, where: str = "") -> tuple[dict[str, Any], bool]:
    """(state, new?) of the tracker run this stage logs to. The run directory's run continues,
    unless this stage already logged into it and now starts afresh (a changed config reruns it):
    then a new tracker run begins, so no step of a stage is recorded twice. ``where`` is the
    tracker's location (a tracking URI): another one means another run."""
    state = read_state(ctx, name)
    stages = state.get("stages", [])
    if state.get("id") and state.get("where", "") == where and (ctx.resume or ctx.stage not in stages):
        fresh = False
    else:
        state, fresh = {"id": uuid.uuid4().hex[:16], "where": where, "stages": []}, True
    if ctx.stage not in state["stages"]:
        state["stages"] = [*state["stages"], ctx.stage]
    write_state(ctx, name, state)
    return state, fresh


# ------------------------------------------------------------------ what is logged


def run_name(ctx: Any) -> str:
    return ctx.config.logging.run_name or Path(ctx.run_dir).name


def project(ctx: Any, env_var: str) -> str:
    return ctx.config.logging.project or os.environ.get(env_var) or "mmcore"


def flat_config(config: Any) -> dict[str, Any]:
    """The config as ``section.key -> value`` (trackers show flat parameters)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub)
        else:
            out[prefix] = value

    walk("", config.model_dump(mode="json"))
    return out


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers among ``metrics`` (a metric may be a string, a list, a nan)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def kept_rows(ctx: Any, step: int) -> list[tuple[int, dict[str, float]]]:
    """(step, numbers) of the rows of ``metrics.jsonl`` up to ``step``: what a stage resumed from
    that step's checkpoint will not log again. A tracker that lost some of them in the kill (wandb
    writes its file every 15 s) logs them from here, so it holds every step once."""
    rows = []
    try:
        lines = (Path(ctx.stage_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line a kill cut short
        at = row.get("step") if isinstance(row, dict) else None
        if isinstance(at, int) and at <= step:
            rows.append((at, numbers({k: v for k, v in row.items() if k not in ("step", "time")})))
    return rows


def stage_files(ctx: Any, manifest: Any) -> dict[str, Path]:
    """Files of a finished stage a tracker keeps: the training plot, the evaluate results."""
    if manifest is None or manifest.status != "finished":
        return {}
    found = {}
    for name in ("train.png", "metrics.json", "report.html"):
        path = Path(ctx.stage_dir) / name
        if path.is_file():
            found[name] = path
    return found


def finishing_files(ctx: Any, name: str, manifest: Any, held: dict[str, Any], runs: Mapping[str, Any]) -> dict[str, Path] | None:
    """What tracker ``name`` logs as a stage ends: the stage's files (:func:`stage_files`), or
    None where it logs nothing -- the tracker is off, or the stage logged no metric and left no
    file (download, convert...), so no tracker run is opened for it. Forgets ``held``'s steps."""
    if not active(ctx, name):
        return None
    key = str(ctx.stage_dir)
    held.pop(key, None)
    files = stage_files(ctx, manifest)
    return files if key in runs or files else None


def evaluate_results(files: Mapping[str, Path]) -> dict[str, float]:
    """The numbers of an evaluate stage's ``metrics.json`` (nested keys joined by dots)."""
    path = files.get("metrics.json")
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub)
        else:
            flat[prefix] = value

    walk("", data)
    return numbers(flat)
