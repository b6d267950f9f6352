"""``mmcore config``: every config key with its type, default, a pack's value and description.

The reference is read off the config classes themselves (pydantic fields and their
``description``), so it cannot drift from what the config accepts; ``docs/configuration.md`` is
this module's Markdown output, checked equal by a test. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator

import click
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mmcore.config import COMMAND_LINE, Layer, RunConfig, build_config, overrides_layer, read_yaml
from mmcore.errors import ConfigError


@dataclass(frozen=True)
class Key:
    """One leaf of a config class: ``training.lr``, its type, default and description."""

    path: str
    type: str
    default: Any
    description: str
    owner: type = BaseModel  # the section class that declares the field (a kit's, a pack's)


def _type_name(annotation: Any) -> str:
    """A reader's name for a field's type: ``int``, ``float | null``, ``cosine | linear``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (list, tuple, set):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}" if args else "mapping"
    if isinstance(annotation, type):
        return {"str": "str", "int": "int", "float": "float", "bool": "bool"}.get(annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _section(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def keys(model: type[BaseModel], prefix: str = "") -> Iterator[Key]:
    """Every leaf key of ``model`` in declaration order, sections walked depth first."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = _section(field.annotation)
        if sub is not None:
            yield from keys(sub, f"{path}.")
            continue
        if field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
        else:
            default = None if field.default is PydanticUndefined else field.default
        owner = next((c for c in model.__mro__ if name in getattr(c, "__annotations__", {})), model)
        yield Key(path, _type_name(field.annotation), default, (field.description or "").strip(), owner)


def section_doc(model: type[BaseModel], path: str) -> str:
    """The docstring of the section at ``path`` (``training.lora``), or ''."""
    current: Any = model
    for part in path.split("."):
        field = current.model_fields.get(part)
        current = _section(field.annotation) if field is not None else None
        if current is None:
            return ""
    doc = current.__doc__ or ""
    return "" if doc.startswith("Base of every config section") else " ".join(doc.split())


def value_at(values: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


# -- the command ------------------------------------------------------------------------------


def _pack_config(pack: str, preset: str | None, config_file: str | None, overrides: list[str]) -> tuple[type[RunConfig], dict[str, Any], dict[str, str], str]:
    """The pack's config class, the resolved values, which layer set each key, and a title."""
    from mmcore.framework.plugins import Plugins
    from mmcore.run.session import config_class, preset_layer

    entry = Plugins.load().pack(pack)
    assert entry.spec is not None
    cls = config_class(entry)
    if preset is None and config_file is None:
        preset = entry.spec.default_preset
    layers: list[Layer] = []
    if preset is not None:
        layers.append(preset_layer(entry, preset))
    if config_file:
        layers.append(Layer(config_file, read_yaml(config_file)))
    if overrides:
        layers.append(overrides_layer(overrides))
    config = build_config(cls, layers)
    origins: dict[str, str] = {}
    for layer in layers:
        for key in _leaves(layer.values):
            origins[key] = "preset " + preset if layer.origin.startswith("preset ") and preset else ("command line" if layer.origin == COMMAND_LINE else layer.origin)
    title = f"pack {pack}" + (f", preset {preset}" if preset else "") + (f", {config_file}" if config_file else "")
    return cls, config.model_dump(mode="json"), origins, title


def _leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _select(all_keys: list[Key], wanted: str | None) -> list[Key]:
    if not wanted:
        return all_keys
    chosen = [k for k in all_keys if k.path == wanted or k.path.startswith(wanted + ".")]
    if not chosen:
        names = [k.path for k in all_keys] + sorted({k.path.rsplit(".", 1)[0] for k in all_keys})
        close = difflib.get_close_matches(wanted, names, n=1)
        raise ConfigError(f"{wanted}: no such config key or section" + (f"; did you mean {close[0]!r}?" if close else ""), hint="mmcore config lists every key")
    return chosen


def render_text(all_keys: list[Key], values: dict[str, Any] | None, origins: dict[str, str], title: str) -> list[str]:
    lines = [f"# {title}: key: type = default" + ("  [this config's value, where it differs, and who set it]" if values is not None else "")]
    for key in all_keys:
        line = f"{key.path}: {key.type} = {_show(key.default)}"
        if values is not None:
            value = value_at(values, key.path)
            if value != json.loads(json.dumps(key.default)):
                line += f"  [{_show(value)}, {origins.get(key.path, 'the pack')}]"
        lines.append(line)
        if key.description:
            lines.append(f"    {key.description}")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: list[Key]) -> list[str]:
    out = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for key in rows:
        out.append(f"| `{key.path}` | {_cell(key.type)} | `{_cell(_show(key.default))}` | {_cell(key.description)} |")
    return out


def render_markdown(pack_classes: dict[str, type[RunConfig]]) -> list[str]:
    """``docs/configuration.md``: the core's keys by section, then what each installed pack adds
    or sets otherwise (packs with the same additions share one table)."""
    core = list(keys(RunConfig))
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `mmcore config --markdown > docs/configuration.md`; a test keeps it equal. -->",
        "",
        "Every key a run's config takes, with its type, default and meaning. Set them in a YAML file",
        "(`--config my.yaml`, sections as below) or on the command line (`training.lr=2e-5`); later",
        "wins: the pack's defaults < the preset < `--config` < options (`--model`, `--data`) <",
        "`key=value` overrides. `mmcore config --pack P [--preset N] [KEY]` prints the same for one",
        "pack, with the values its preset sets. An unknown key is an error naming the file and key.",
        "",
    ]
    for section in RunConfig.model_fields:
        rows = [k for k in core if k.path.split(".")[0] == section]
        lines.append(f"## `{section}`")
        lines.append("")
        doc = section_doc(RunConfig, section)
        if doc:
            lines += [doc, ""]
        for sub in sorted({k.path.rsplit(".", 1)[0] for k in rows if k.path.count(".") > 1}):
            subdoc = section_doc(RunConfig, sub)
            if subdoc:
                lines += [f"`{sub}`: {subdoc}", ""]
        lines += _table(rows) + [""]
    core_by_path = {k.path: k for k in core}
    kit_keys: dict[type, tuple[list[Key], list[str]]] = {}  # a kit's section class -> its keys, the packs
    groups: dict[str, tuple[list[Key], list[str]]] = {}  # a pack's table -> its keys, the packs
    for name, cls in sorted(pack_classes.items()):
        extra = [k for k in keys(cls) if core_by_path.get(k.path) != k]
        own = [k for k in extra if not k.owner.__module__.startswith("mmcore.")]
        for key in extra:
            if key not in own:
                kit = kit_keys.setdefault(key.owner, ([], []))
                if key.path not in {k.path for k in kit[0]}:
                    kit[0].append(key)
                if name not in kit[1]:
                    kit[1].append(name)
        if own:
            groups.setdefault("\n".join(_table(own)), (own, []))[1].append(name)
    if kit_keys:
        lines += ["## Keys the kits add", "", "The VLM and diffusion kits' config sections, which the packs built on them take.", ""]
        for owner, (rows, names) in sorted(kit_keys.items(), key=lambda item: item[0].__qualname__):
            doc = " ".join((owner.__doc__ or "").split())
            lines += [f"### `{sdk_path(owner)}`", "", (doc + " " if doc else "") + "Packs: " + ", ".join(f"`{n}`" for n in names) + ".", ""] + _table(rows) + [""]
    if groups:
        lines += ["## Keys the packs add", "", "Keys a pack's config adds to the ones above, or whose default it sets otherwise.", ""]
        for rows, names in sorted(groups.values(), key=lambda item: item[1]):
            lines += [f"### {', '.join(f'`{n}`' for n in names)}", ""] + _table(rows) + [""]
    return lines[:-1] if lines[-1] == "" else lines


def installed_pack_classes() -> dict[str, type[RunConfig]]:
    from mmcore.framework.plugins import Plugins
    from mmcore.run.session import config_class

    plugins = Plugins.load()
    out = {}
    for name, entry in plugins.packs.items():
        if entry.ok and entry.spec is not None:
            out[name] = config_class(entry)
    return out


@click.command("config")
@click.option("--pack", "-p", default=None, help="Show this pack's keys and the values its preset sets.")
@click.option("--preset", default=None, help="The pack's preset (default: its default preset).")
@click.option("--config", "config_file", default=None, help="Also apply this YAML config file.")
@click.option("--markdown", is_flag=True, help="The whole reference as Markdown (docs/configuration.md).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("args", nargs=-1, metavar="[KEY] [key.path=value]...")
def config_cmd(pack: str | None, preset: str | None, config_file: str | None, markdown: bool, as_json: bool, args: tuple[str, ...]) -> None:
    """Every config key (or KEY, a key or section) with its type, default and description;
    with --pack, the values the pack's preset (and --config, key=value overrides) sets."""
    if markdown:
        click.echo("\n".join(render_markdown(installed_pack_classes())))
        return
    overrides = [a for a in args if "=" in a]
    wanted = [a for a in args if "=" not in a]
    if len(wanted) > 1:
        raise ConfigError(f"one KEY at most, got {', '.join(wanted)}", hint="mmcore config training, or mmcore config training.lr")
    key = wanted[0] if wanted else None
    if (preset or config_file or overrides) and not pack:
        raise ConfigError("--preset, --config and key=value overrides need --pack", hint="mmcore config --pack qwen2vl --preset demo")
    values: dict[str, Any] | None = None
    origins: dict[str, str] = {}
    cls: type[RunConfig] = RunConfig
    title = "mmcore's core config"
    if pack:
        cls, values, origins, title = _pack_config(pack, preset, config_file, overrides)
    chosen = _select(list(keys(cls)), key)
    if as_json:
        rows = [
            {"key": k.path, "type": k.type, "default": k.default, "description": k.description} | ({"value": value_at(values, k.path), "set_by": origins.get(k.path)} if values is not None else {})
            for k in chosen
        ]
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo("\n".join(render_text(chosen, values, origins, title)))


def sdk_path(owner: type) -> str:
    """Where a pack imports ``owner`` from: its SDK façade (``mmcore.kits.VideoData``), or
    where it is defined when no façade lists it."""
    import importlib

    from mmcore.sdk import SURFACE

    for facade, names in SURFACE.items():
        if owner.__qualname__ in names and getattr(importlib.import_module(facade), owner.__qualname__, None) is owner:
            return f"{facade}.{owner.__qualname__}"
    return f"{owner.__module__}.{owner.__qualname__}"


__all__ = ["Key", "keys", "render_markdown", "render_text", "config_cmd"]
