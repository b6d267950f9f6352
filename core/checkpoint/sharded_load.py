"""Build a model without memory, shard it, then load each rank's part of the weights.

The train engine builds a recipe's model under :func:`parameters_on_meta` (parameters take no
memory and run no initialisation), lets the backend shard it, then :func:`materialise` gives
every parameter real (sharded) storage and :func:`load_weights` reads the converted DCP
checkpoint straight into it: each rank reads and holds only its shards, so host memory per rank
is the checkpoint divided by the world size, not the whole model.

Buffers are built for real (they are small): non-persistent ones (rotary ``inv_freq``) are in
no checkpoint and must keep the values ``__init__`` computed; persistent ones are loaded.
Tied parameters (an output layer sharing the embedding) stay one parameter and are read once.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside the block is put on the meta device."""
    from torch import nn

    original = nn.Module.register_parameter

    def register(module: Any, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.data.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def on_meta(model: Any) -> bool:
    return any(p.device.type == "meta" for p in model.parameters())


def materialise(model: Any, device: Any) -> None:
    """Give every (sharded) parameter uninitialised storage on ``device``; buffers keep their values."""
    buffers = [(module, name, buf) for module in model.modules() for name, buf in module._buffers.items() if buf is not None]
    holders: dict[int, list[tuple[Any, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, name))
    model.to_empty(device=device)
    for module, name, buf in buffers:
        module._buffers[name] = buf.to(device)
    for (first, first_name), *others in (h for h in holders.values() if len(h) > 1):
        for module, name in others:  # to_empty makes a new parameter per module: tie them again
            module._parameters[name] = first._parameters[first_name]


def load_weights(model: Any, checkpoint: Path, *, distributed: bool, names: Callable[[str], str | None] = lambda k: k) -> None:
    """Read ``checkpoint`` (``model.<name>`` keys, as :func:`mmcore.engines.convert.hf_to_dcp` writes)
    into the model's parameters and buffers in place, each rank its own shards.

    ``names`` maps a state key of the model to its key in the checkpoint, or to None for one
    the checkpoint does not hold (a LoRA adapter over a base checkpoint, initialised apart)."""
    from mmcore.checkpoint import safe_dcp

    first: dict[int, str] = {}
    alias: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            alias[name] = first[id(param)]
        else:
            first[id(param)] = name
    own = {k: v for k, v in model.state_dict().items() if k not in alias and names(k) is not None}
    state = {f"model.{names(k)}": v for k, v in own.items()}
    safe_dcp.load(state, checkpoint, distributed=distributed)
    loaded = {k: state[f"model.{names(k)}"] for k in own}
    held = [k for k in model.state_dict() if names(alias.get(k, k)) is not None]
    model.load_state_dict({k: loaded[alias.get(k, k)] for k in held}, strict=len(held) == len(model.state_dict()))


__all__ = ["parameters_on_meta", "on_meta", "materialise", "load_weights"]
