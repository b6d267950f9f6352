"""Declared stages and the stage-output contract.

A pack's ``PackSpec.stages`` table becomes one small pluggy plugin (:func:`declared_stages`)
whose ``mmcore_<stage>`` hooks import the declared function and its parts when the stage
runs, so the runner and every wrapper plugin see declared and hand-written stages alike.

:func:`check_result` enforces what a finished stage hands on: a :class:`StageResult` (or
None to decline) whose outputs include the names :data:`mmcore.framework.pack.STAGE_OUTPUTS` sets for
the stage and point at something that exists. Its :class:`ContractError` names the pack,
the stage and the rule, and the runner writes it to the stage's ``error.log``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore import hookimpl
from mmcore.errors import StageError
from mmcore.framework.pack import STAGE_OUTPUTS, PackSpec, StageResult


class ContractError(StageError):
    """A pack broke the stage contract: a fault in the pack, not in the user's input."""

    def __init__(self, pack: str, stage: str, rule: str, message: str) -> None:
        super().__init__(f"pack {pack!r} broke the stage contract at {stage} ({rule}): {message}", hint="this is a bug in the pack; report it to its authors")
        self.rule = rule


def declared_stages(spec: PackSpec) -> object:
    """A plugin implementing ``mmcore_<stage>`` for each stage in ``spec.stages``."""
    from mmcore.framework.hookspecs import STAGE_HOOKS

    methods: dict[str, Any] = {}
    for stage in spec.stages:
        methods[STAGE_HOOKS[stage]] = hookimpl(_stage_hook(spec, stage))
    cls = type(f"DeclaredStages[{spec.name}]", (), methods)
    return cls()


def _stage_hook(spec: PackSpec, stage: str) -> Any:
    declared = spec.declared(stage)

    def bound() -> Any:
        from mmcore.framework.registry import import_object

        try:
            function = import_object(declared.function)
            parts = {name: import_object(path) for name, path in declared.parts.items()}
        except (ImportError, AttributeError) as exc:
            raise ContractError(spec.name, stage, "declared stage imports", f"cannot import {declared.function} or its parts: {type(exc).__name__}: {exc}") from exc
        return lambda *args, **kwargs: function(*args, **parts, **declared.options, **kwargs)

    # pluggy hands a hook the parameters its signature names, so each kind has its own
    def run(self: Any, ctx: Any, upstream: Mapping[str, Any]) -> Any:
        return bound()(ctx, upstream)

    def infer(self: Any, ctx: Any, upstream: Mapping[str, Any], model: Any, requests: list[Any]) -> Any:
        return bound()(ctx, upstream, model=model, requests=requests)

    hook = infer if stage == "infer" else run
    hook.__name__ = f"mmcore_{stage}"
    return hook


def check_result(pack: str, stage: str, result: Any, stage_dir: Path, *, check_paths: bool = True) -> None:
    """Raise :class:`ContractError` unless ``result`` is what stage ``stage`` must hand on.

    ``check_paths``: also require the contract's outputs to exist. The runner asks it of rank 0
    alone: on several nodes without a shared file system, another node may hold only its part.
    """
    if result is None:
        return
    if not isinstance(result, StageResult):
        raise ContractError(pack, stage, "return type", f"returned {type(result).__name__}, not mmcore.StageResult or None")
    for name in STAGE_OUTPUTS.get(stage, ()):
        if name not in result.outputs:
            have = ", ".join(sorted(result.outputs)) or "none"
            raise ContractError(pack, stage, f"{stage} records output {name!r}", f"its outputs are: {have}")
    for name, value in result.outputs.items():
        if not isinstance(value, str):
            raise ContractError(pack, stage, "outputs are paths", f"output {name!r} is a {type(value).__name__}, not a str path")
    for name in STAGE_OUTPUTS.get(stage, ()) if check_paths else ():
        path = Path(result.outputs[name])
        if not (path if path.is_absolute() else stage_dir / path).exists():
            raise ContractError(pack, stage, f"output {name!r} exists", f"{path} does not exist")


__all__ = ["ContractError", "check_result", "declared_stages"]
