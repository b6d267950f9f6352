"""megatron-core's distributed checkpoint (``dist_checkpointing``) of a model and its optimizer:
saved at one tensor-/pipeline-parallel layout, loaded at another (each tensor's global shape and
its shard's offsets are in the checkpoint, so it reshards at load; MindSpeed-MM's "TP/PP at
convert must match training" does not apply).

A model here is a module whose megatron-core children (``GPTModel``) say how they are sharded
(``sharded_state_dict``) and whose other children (a transformers vision tower) are replicated
on every rank. The optimizer is a torch optimizer over the model's parameters (AdamW or SGD): each
state tensor is sharded as its parameter is; the step count, the same for every parameter, is
kept once. A moving average of the trained weights (``training.ema``) is sharded as its
parameter too, under ``ema.<the parameter's key>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

#: optimizer state entries that are not shaped like their parameter (AdamW's step count)
SCALAR_STATE = ("step",)


def sharded_state(model: Any) -> dict[str, Any]:
    """The model's ``dist_checkpointing`` state: megatron-core children by their own sharding,
    every other child's tensors as replicated (the parameters themselves, so that an
    optimizer's state can be matched to them). A ``ModuleList`` of virtual-stage chunks: each
    chunk's, under the list's own state-dict names (``0.``, ``1.``); the checkpoint's keys
    stay the chunks' (each layer under its global number), so any layout reads them."""
    import torch
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    if isinstance(model, torch.nn.ModuleList):
        return {f"{v}.{key}": value for v, chunk in enumerate(model) for key, value in sharded_state(chunk).items()}
    state: dict[str, Any] = {}
    for name, child in model.named_children():
        if hasattr(child, "sharded_state_dict"):
            state.update(child.sharded_state_dict(prefix=f"{name}."))
        else:
            state.update(make_sharded_tensors_for_checkpoint(child.state_dict(keep_vars=True), f"{name}."))
    return state


def _optimizer_state(model_state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """The optimizer's state, each tensor sharded as its parameter, the step count apart."""
    from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, optim_state_to_sharding_state

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = optimizer.state_dict()
    steps = {float(s["step"]) for s in state["state"].values() if "step" in s}
    optim_state_to_sharding_state(state, get_param_id_to_sharded_param_map(model_state, params), exclude_keys=SCALAR_STATE)
    return {"optimizer": state, "optimizer_step": steps.pop() if steps else 0.0}


def _average_state(model_state: dict[str, Any], averages: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """Each (parameter, its average) pair's average, sharded as the parameter."""
    from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, make_sharded_optimizer_tensor

    sharded = get_param_id_to_sharded_param_map(model_state, [parameter for parameter, _ in averages])
    return {str(i): make_sharded_optimizer_tensor(sharded[i], average, "ema") for i, (_, average) in enumerate(averages)}


def save(model: Any, folder: Path, optimizer: Any = None, common: dict[str, Any] | None = None, averages: Sequence[tuple[Any, Any]] = ()) -> None:
    """Every rank calls it: each writes its shards once (replicas are written by one of them).
    ``common``: small objects every rank holds alike (the data position, the scheduler);
    ``averages``: (parameter, its moving average) pairs."""
    from megatron.core import dist_checkpointing

    _results_in_process()
    state = sharded_state(model)
    everything: dict[str, Any] = {"model": state, "common": common or {}}
    if optimizer is not None:
        everything.update(_optimizer_state(state, optimizer))
    if averages:
        everything["ema"] = _average_state(state, averages)
    folder.mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(everything, str(folder))


def _results_in_process() -> None:
    """megatron-core 0.16's writer collects its write results through a queue of a
    ``multiprocessing`` Manager: a server process, stopped only by the interpreter's exit hooks.
    A training process that ends by ``os._exit`` (mmcore's workers do) or is killed leaves it
    running, holding the run's stdout. This save is synchronous (the writer's own processes
    report through a queue of their own), so the results never leave this process: a plain
    queue serves, and there is no server to leave behind."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not isinstance(filesystem_async._results_queue, queue.Queue):
        filesystem_async._results_queue = queue.Queue()


def load(model: Any, folder: Path, optimizer: Any = None, averages: Sequence[tuple[Any, Any]] = ()) -> dict[str, Any]:
    """Every rank calls it: fills ``model`` (built at any layout), ``optimizer`` (over its
    parameters) and the ``averages`` of (parameter, average) pairs from the checkpoint;
    returns the saved ``common`` objects."""
    import torch
    from megatron.core import dist_checkpointing

    state = sharded_state(model)
    wanted: dict[str, Any] = {"model": state, "common": {}}
    if optimizer is not None:
        from mmcore.train.optim import empty_state

        for group in optimizer.param_groups:  # state tensors to load into, shaped as the parameters
            for parameter in group["params"]:
                optimizer.state[parameter] = empty_state(optimizer, parameter)
        counts_steps = any("step" in entry for entry in optimizer.state.values())  # AdamW's count, saved once (SCALAR_STATE); SGD has none
        wanted.update(_optimizer_state(state, optimizer))
    if averages:
        wanted["ema"] = _average_state(state, averages)
    loaded = dist_checkpointing.load(wanted, str(folder))
    model.load_state_dict(loaded["model"], strict=True)
    with torch.no_grad():
        for i, (_, average) in enumerate(averages):
            average.copy_(loaded["ema"][str(i)])
    if optimizer is not None:
        optimizer_state = loaded["optimizer"]
        for entry in optimizer_state["state"].values():
            if counts_steps:
                entry["step"] = torch.tensor(float(loaded["optimizer_step"]))
        optimizer_state["param_groups"] = [{**group, "params": own["params"]} for group, own in zip(optimizer_state["param_groups"], optimizer.state_dict()["param_groups"])]
        optimizer.load_state_dict(optimizer_state)
    return dict(loaded.get("common", {}))


__all__ = ["sharded_state", "save", "load", "SCALAR_STATE"]
