"""Key coverage: does a converted checkpoint hold exactly the training model's tensors?

The model is built on the meta device (shapes only, no memory, no init cost) and its
``state_dict`` is the reference: tied parameters once, under their first name, as
:func:`mmcore.train.loop.load_converted` reads them. The convert stage fails on any gap, naming the
key, before it writes anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from mmcore.engines.state_dict import TensorInfo
from mmcore.errors import StageError
from mmcore.engines.download import remote_code

if TYPE_CHECKING:
    from torch import nn


def expected_tensors(model: "nn.Module") -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The tensors a converted checkpoint must hold for ``model`` (built on the meta device),
    and the tied aliases it must not: ``alias -> name stored``. Tied parameters are one
    object under several names; the first name in ``state_dict`` order is the one stored,
    as :func:`mmcore.train.loop.load_converted` reads it."""
    stored: dict[str, TensorInfo] = {}
    aliases: dict[str, str] = {}
    first: dict[int, str] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            aliases[key] = first[id(tensor)]
            continue
        first[id(tensor)] = key
        stored[key] = TensorInfo(tuple(tensor.shape), tensor.dtype)
    return stored, aliases


def coverage_problems(planned: Mapping[str, TensorInfo], expected: Mapping[str, TensorInfo], aliases: Mapping[str, str]) -> list[str]:
    """Every way the adapter's output fails to be the training model's state dict.

    Floating dtypes may differ (a bf16 hub checkpoint loads into fp32 master weights: DCP casts
    on load); a floating tensor for an integer one, or any shape difference, may not.
    """
    problems = []
    for key in sorted(set(expected) - set(planned)):
        alias_of = [a for a, target in aliases.items() if target == key and a in planned]
        hint = f" (the adapter produced its tied alias {alias_of[0]!r})" if alias_of else ""
        problems.append(f"{key}: the model has it, the converted checkpoint does not{hint}: an adapter rule drops or misnames it")
    for key in sorted(set(planned) - set(expected)):
        if key in aliases:
            continue  # a tied alias written too: harmless, load_converted reads the first name
        problems.append(f"{key}: converted but the model has no such tensor: an adapter rule maps a hub tensor to a wrong name")
    for key in sorted(set(planned) & set(expected)):
        have, want = planned[key], expected[key]
        if have.shape != want.shape:
            problems.append(f"{key}: shape {have.shape} in the checkpoint, {want.shape} in the model")
        elif have.dtype.is_floating_point != want.dtype.is_floating_point:
            problems.append(f"{key}: dtype {have.dtype} in the checkpoint, {want.dtype} in the model")
    return problems


def build_on_meta(build: Callable[[Path], "nn.Module"], model_dir: Path) -> "nn.Module":
    """``build(model_dir)`` with every tensor on the meta device: shapes only, no memory, no init cost."""
    import torch

    with torch.device("meta"):
        return build(model_dir)


def model_from_config(folder: Path) -> "nn.Module | None":
    """The transformers model ``folder/config.json`` names (``architectures[0]``), on the meta
    device; None where there is no such config or class."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return None
    try:
        name = (json.loads(config_file.read_text()).get("architectures") or [None])[0]
        import transformers
        from transformers import AutoConfig

        cls = getattr(transformers, name) if name else None
        if cls is None:
            return None
        config = AutoConfig.from_pretrained(folder, **remote_code())
        return build_on_meta(lambda _: cls(config), folder)
    except (ImportError, AttributeError, ValueError, OSError):
        return None


__all__ = ["expected_tensors", "coverage_problems", "build_on_meta", "model_from_config"]


def load_strictly(module: "nn.Module", state: Mapping[str, Any], where: Any, described: str = "the model", *, error: type[Exception] = StageError, assign: bool = False) -> None:
    """``module.load_state_dict(state, strict=True)`` for a pack that carries its own modeling
    code and reads a public checkpoint: a missing, unexpected or misshapen tensor is first told in
    one line naming ``where`` (the file or folder) and the first of each kind, as ``error``.

    :param module: the model (or part) the checkpoint is for; on the meta device with ``assign``.
    :param state: the checkpoint's tensors, under the module's names.
    :param where: what the user passed (a path), for the message.
    :param described: what the module is, for the message (e.g. "the model config.json describes").
    :param error: the exception class raised (a pack's own, where its callers catch that).
    :param assign: load by assigning the tensors (a module built on the meta device).
    """
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        what = [f"{len(missing)} missing (first {missing[0]})"] if missing else []
        what += [f"{len(unexpected)} unexpected (first {unexpected[0]})"] if unexpected else []
        if shapes:
            first = shapes[0]
            what.append(f"{len(shapes)} of another shape (first {first}: {tuple(state[first].shape)} in the checkpoint, {tuple(own[first].shape)} in {described})")
        raise error(f"{where}: the weights do not fit {described}: {', '.join(what)}")
    module.load_state_dict(state, strict=True, assign=assign)
