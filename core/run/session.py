"""Resolving what a command works on: the pack, its config, and the run directory."""

from __future__ import annotations

import importlib.resources
import inspect
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcore.config import COMMAND_LINE, LAUNCH_OPTIONS, Layer, RunConfig, build_config, overrides_layer, read_yaml, without_permissions
from mmcore.errors import ConfigError, UsageError
from mmcore.framework.files import atomic_write_json
from mmcore.framework.plugins import Entry, Plugins
from mmcore.framework.registry import import_object
from mmcore.run.rundir import RunDir


def config_class(entry: Entry) -> type[RunConfig]:
    assert entry.spec is not None
    try:
        cls = import_object(entry.spec.config_class)
    except Exception as exc:
        raise ConfigError(f"pack {entry.name!r}: cannot import its config class {entry.spec.config_class!r}: {exc}") from None
    if not (inspect.isclass(cls) and issubclass(cls, RunConfig)):
        raise ConfigError(f"pack {entry.name!r}: {entry.spec.config_class} is not a subclass of mmcore.config.RunConfig")
    return cls


def preset_layer(entry: Entry, preset: str) -> Layer:
    assert entry.spec is not None
    presets = entry.spec.presets
    if preset not in presets:
        known = ", ".join(sorted(presets)) or "none"
        raise ConfigError(f"pack {entry.name!r} has no preset {preset!r}; its presets: {known}")
    source = presets[preset]
    origin = f"preset {preset!r} of pack {entry.name!r}"
    if isinstance(source, dict):
        return Layer(origin, source)
    if ":" in entry.value and entry.distribution != "(in-process)":
        module = importlib.import_module(entry.value.partition(":")[0])  # the entry point's module
    else:
        module = entry.plugin if inspect.ismodule(entry.plugin) else inspect.getmodule(type(entry.plugin))
    package = module.__name__ if getattr(module, "__path__", None) else module.__name__.rpartition(".")[0]
    resource = importlib.resources.files(package).joinpath(str(source))
    with importlib.resources.as_file(resource) as path:
        return Layer(origin, read_yaml(path, origin=f"{origin} ({source})"))


@dataclass
class Request:
    """What the user asked for on the command line (every field optional)."""

    pack: str | None = None
    config_file: str | None = None
    preset: str | None = None
    run_dir: str | None = None
    model: str | None = None
    data: list[str] = field(default_factory=list)
    device: str | None = None
    offline: bool = False
    overrides: list[str] = field(default_factory=list)


@dataclass
class Session:
    plugins: Plugins
    pack: str
    config: RunConfig
    run_dir: RunDir
    preset: str | None


#: Directories that are never a run directory, whatever the user typed.
SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/mnt", "/media"]
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def check_run_dir(path: Path, pack: str | None) -> dict[str, Any] | None:
    """Refuse a ``--run-dir`` mmcore must not write into; returns its ``run.json`` if it is a run.

    A file, a system or home directory, a non-empty directory that is not an mmcore run, and a
    run of another pack are refused in one line before anything is written or deleted.
    """
    resolved = path.expanduser().resolve()
    if str(resolved) in SYSTEM_DIRS or resolved == Path.home().resolve():
        raise UsageError(f"--run-dir {path}: {resolved} is a system directory, not a place for a run", hint="give a new or existing run directory, e.g. runs/my-run")
    if resolved.exists() and not resolved.is_dir():
        raise UsageError(f"--run-dir {path}: {resolved} is a file, not a directory")
    if not resolved.is_dir():
        return None
    rd = RunDir(resolved)
    saved = rd.read_run_json()
    if saved is None and rd.run_json_path.exists():
        raise UsageError(f"{rd.run_json_path}: unreadable (not the JSON mmcore writes); nothing was changed", hint="restore it, or delete it to adopt the directory afresh")
    if saved is None:
        leftovers = [p.name for p in resolved.iterdir() if p.name not in (".lock", ".workers.lock", "run.json", "config.yaml")]
        if leftovers:
            raise UsageError(
                f"--run-dir {path}: {resolved} is not empty and is not an mmcore run directory (no run.json; it holds {leftovers[0]!r}"
                + (f" and {len(leftovers) - 1} more)" if len(leftovers) > 1 else ")"),
                hint="give an empty or new directory",
            )
        return None
    if pack and saved.get("pack") and saved["pack"] != pack:
        raise UsageError(f"--run-dir {path}: {resolved} is a run of pack {saved['pack']!r}, not {pack!r}; nothing was changed", hint=f"use --pack {saved['pack']}, or another --run-dir for {pack}")
    return saved


def open_session(plugins: Plugins, request: Request, *, runs_root: str = "runs", read_run_dir: bool = True) -> Session:
    """Resolve pack, config and run directory (``record_session`` writes them).

    ``read_run_dir=False``: the config from the command alone, the run directory neither checked
    nor continued from -- what a following node of a multi-node run may look at before node 0
    has finished writing that directory (:func:`mmcore.run.nodes.await_node0`).
    """
    saved = check_run_dir(Path(request.run_dir), request.pack) if request.run_dir and read_run_dir else None
    pack = request.pack or (saved or {}).get("pack")
    if not pack:
        raise UsageError("--pack is required (or --run-dir of an existing run)")
    entry = plugins.pack(pack)
    assert entry.spec is not None
    cls = config_class(entry)

    layers: list[Layer] = []
    preset = request.preset
    continuing = saved is not None and saved.get("pack") == pack and not request.preset and not request.config_file
    if continuing:
        # Same run, no new base config: continue from the config it was made with, less what
        # only the user grants (model.trust_remote_code): the run directory is data, not authority.
        # Nor how the last command was launched (parallel.nnodes, node_rank, rdzv_endpoint): this
        # command's options say that.
        layers.append(run_dir_layer(RunDir(request.run_dir), launch_options=False))  # type: ignore[arg-type]
        preset = saved.get("preset")  # type: ignore[union-attr]
    else:
        if preset is None and request.config_file is None:
            preset = entry.spec.default_preset
        if preset is not None:
            layers.append(preset_layer(entry, preset))
        if request.config_file:
            layers.append(Layer(request.config_file, read_yaml(request.config_file)))
    cli: dict[str, Any] = {}
    if request.model:
        cli.setdefault("model", {})["source"] = request.model
    if request.data:
        cli.setdefault("data", {})["datasets"] = [str(Path(p).absolute()) for p in request.data]
    if request.device:
        cli.setdefault("run", {})["device"] = request.device
    if request.offline:
        cli.setdefault("run", {})["offline"] = True
    if cli:
        layers.append(Layer(COMMAND_LINE, cli))
    if request.overrides:
        layers.append(overrides_layer(request.overrides))
    config = build_config(cls, layers)

    if config.run.name and (not _NAME.match(config.run.name) or config.run.name in (".", "..")):
        raise ConfigError(f"run.name {config.run.name!r} must be a plain name (letters, digits, . _ + -), not a path", hint="use --run-dir for a directory elsewhere")
    name = config.run.name or _default_name(pack, preset, request.config_file)
    if not request.run_dir and read_run_dir:
        check_run_dir(Path(runs_root) / name, pack)
    run_dir = RunDir(request.run_dir or Path(runs_root) / name)
    return Session(plugins, pack, config, run_dir, preset)


def run_dir_layer(run_dir: RunDir, *, launch_options: bool = True) -> Layer:
    """A run directory's ``config.yaml`` as a config layer, without the permissions in it
    (:data:`mmcore.config.PERMISSIONS`): a copied or planted run cannot grant itself any.
    ``launch_options=False``: without :data:`mmcore.config.LAUNCH_OPTIONS` either (a new command
    continuing the run; a worker of this command reads them)."""
    values = without_permissions(read_yaml(run_dir.config_path))
    if not launch_options:
        values = without_permissions(values, keys=LAUNCH_OPTIONS)
    return Layer(str(run_dir.config_path), values)


def record_session(session: Session, request: Request) -> None:
    """Write ``run.json`` and the resolved ``config.yaml`` (what distributed workers read)."""
    from mmcore.config import dump_config

    rd = session.run_dir
    rd.root.mkdir(parents=True, exist_ok=True)
    old = rd.read_run_json() or {}
    atomic_write_json(
        rd.run_json_path,
        {
            "pack": session.pack,
            "preset": session.preset,
            "config_file": str(Path(request.config_file).absolute()) if request.config_file else old.get("config_file"),
            "overrides": request.overrides or old.get("overrides", []),
            "created_at": old.get("created_at", time.time()),
        },
    )
    dump_config(session.config, rd.config_path)


def _default_name(pack: str, preset: str | None, config_file: str | None) -> str:
    if config_file:
        return f"{pack}-" + re.sub(r"[^A-Za-z0-9._+-]+", "-", Path(config_file).stem).strip("-.")
    return f"{pack}-{preset}" if preset else pack
