"""Layers of configuration values and how they merge: YAML files, presets and dotted
command-line overrides, later wins, each value remembering where it came from so that a
validation error names the file (or the command line) and the key (:func:`build_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from mmcore.config.errors import format_validation_error
from mmcore.config.knobs import check_training, without_derived
from mmcore.config.sections import RunConfig
from mmcore.errors import ConfigError


COMMAND_LINE = "command line"


class Layer:
    """One source of values (a file, a preset, the command line) as a nested mapping."""

    def __init__(self, origin: str, values: Mapping[str, Any]) -> None:
        self.origin = origin
        self.values = dict(values)


def read_yaml(path: str | Path, origin: str | None = None) -> dict[str, Any]:
    """A YAML mapping from ``path``; every problem is a one-line :class:`ConfigError`."""
    path = Path(path)
    origin = origin or str(path)
    if not path.is_file():
        raise ConfigError(f"{origin}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark else origin
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{origin}: cannot read: {exc}") from None
    except RecursionError:  # the YAML parser recurses once per level
        raise ConfigError(f"{origin}: nested deeper than {MAX_DEPTH} levels (a config's keys are a few levels deep)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``training.lr=1e-5`` -> (["training", "lr"], 1e-5). Values are parsed as YAML scalars/lists."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{COMMAND_LINE}: override {text!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
        flat = raw.strip()
        if flat.startswith("[") and flat.endswith("]") and not any(c in flat[1:-1] for c in "[]{}'\""):
            # a list of globs: YAML reads a leading * as an alias ([*.q_proj, *.v_proj])
            value = [item.strip() for item in flat[1:-1].split(",") if item.strip()]
    if isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
        except ValueError:
            pass
    return key.split("."), value


def nest(path: list[str], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return out


def _merge(base: dict[str, Any], new: Mapping[str, Any], origin: str, origins: dict[tuple[str, ...], str], prefix: tuple[str, ...] = ()) -> None:
    for key, value in new.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value, origin, origins, path)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
            _mark(value, origin, origins, path)


def _mark(value: Any, origin: str, origins: dict[tuple[str, ...], str], path: tuple[str, ...]) -> None:
    origins[path] = origin
    if isinstance(value, Mapping):
        for key, sub in value.items():
            _mark(sub, origin, origins, (*path, str(key)))


#: Deeper than this is no config a person wrote; merging and validating recurse once per level.
MAX_DEPTH = 32
#: Integers beyond 64 bits fit no seed, count or size the stages hand to torch or numpy.
INT64 = range(-(2**63), 2**63)


def _check_values(layer: Layer) -> None:
    """Refuse what would fail later as a RecursionError or an OverflowError deep in a stage."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), layer.values)]
    while stack:
        path, value = stack.pop()
        key = ".".join(path) or "(top level)"
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{layer.origin}: {'.'.join(path[:3])}...: nested deeper than {MAX_DEPTH} levels (a config's keys are a few levels deep)")
        if isinstance(value, Mapping):
            stack.extend(((*path, str(k)), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, str(i)), v) for i, v in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool) and value not in INT64:
            raise ConfigError(f"{layer.origin}: {key}: {value} does not fit in 64 bits")


def build_config(config_class: type[RunConfig], layers: list[Layer]) -> RunConfig:
    """Merge ``layers`` in order and validate; errors become one :class:`ConfigError` line each."""
    merged: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    for layer in layers:
        _check_values(layer)
        _merge(merged, layer.values, layer.origin, origins)
    try:
        config = config_class.model_validate(merged)
    except ValidationError as exc:
        lines = format_validation_error(exc, config_class, origins)
        raise ConfigError("\n".join(lines)) from None
    check_training(config.training, origins, [layer.origin for layer in layers])
    return config


def overrides_layer(overrides: list[str]) -> Layer:
    values: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    for text in overrides:
        path, value = parse_override(text)
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{COMMAND_LINE}: {'.'.join(path[:3])}...: nested deeper than {MAX_DEPTH} levels (a config's keys are a few levels deep)")
        _merge(values, nest(path, value), COMMAND_LINE, origins)
    return Layer(COMMAND_LINE, values)


#: Keys that say how one command is launched (which node this is, how many, where they meet):
#: they come from that command, never from a run directory's ``config.yaml`` -- a failed
#: two-node attempt must not make every later plain rerun wait for a second node.
LAUNCH_OPTIONS = (("parallel", "nnodes"), ("parallel", "node_rank"), ("parallel", "rdzv_endpoint"))

#: Keys that grant a permission: they come from the user's command line or own ``--config``
#: file, never from a run directory's ``config.yaml`` (data that whoever can write the
#: directory controls).
PERMISSIONS = (("model", "trust_remote_code"),)


def without_permissions(values: Mapping[str, Any], *, keys: tuple[tuple[str, str], ...] = PERMISSIONS) -> dict[str, Any]:
    """``values`` (a config read from a run directory) less :data:`PERMISSIONS` (or ``keys``)."""
    out = dict(values)
    for section, key in keys:
        if isinstance(out.get(section), Mapping) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def dump_config(config: RunConfig, path: Path) -> None:
    from mmcore.framework.files import atomic_write_text

    text = yaml.safe_dump(without_derived(config.model_dump(mode="json")), sort_keys=False)
    atomic_write_text(path, text)
