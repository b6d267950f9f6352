"""Measure, on a real training step, the per-rank quantities ``mmcore plan`` predicts, split the
same way: parameter, gradient and optimizer-state bytes of this rank's tensors after one step
(DTensor shards counted by their local part), and activation memory as the bytes of the tensors
autograd saves for backward (unique storages, the weights left out), plus, where a block is
recomputed, the inputs its checkpoint keeps instead.

The step runs the engine's own pieces: the family builds the model, ``training.recompute`` is
:func:`mmcore.train.recompute.apply_recompute` on the recipe's blocks, sharding is the FSDP2
backend's (``fully_shard`` per block then the root, fp32 on one process unsharded, as the engine
does), the optimizer is :func:`mmcore.train.optim.build_optimizer` from the default ``training``
section, the loss is the kit's (``VLMFamily.loss_sum``; the diffusion kit's ``diffusion_loss``).

    torchrun --nproc-per-node 2 -m mmcore.plan.measure --pack qwen2vl --model DIR --seq 64 --recompute full

prints one JSON line per rank: the measured figures, the plan's predictions, and the step's
FLOPs by the engine's accounting next to the plan's.
"""

from __future__ import annotations

import argparse
import json
import os
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Sequence


def _storages(values: Iterable[Any], into: dict[int, int]) -> None:
    import torch

    for value in values:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            into.setdefault(storage.data_ptr(), storage.nbytes())
        elif isinstance(value, (tuple, list)):
            _storages(value, into)
        elif isinstance(value, dict):
            _storages(value.values(), into)


def saved_activation_bytes(model: Any, forward: Callable[[], Any], recomputed: Iterable[Any] = ()) -> tuple[Any, int]:
    """(``forward()``'s result, bytes saved for its backward): the unique storages autograd's
    saved-tensor hooks see, weights excluded, plus the arguments of each ``recomputed`` block
    (its checkpoint keeps them; what runs inside it saves nothing until backward)."""
    import torch

    saved: dict[int, int] = {}
    running: list[set[int]] = []  # the weights of the modules being run, innermost last
    handles = []

    def enter(module: Any, args: Any) -> None:
        running.append({p.untyped_storage().data_ptr() for p in module.parameters(recurse=False)})

    def leave(module: Any, args: Any, output: Any) -> None:
        running.pop()

    def keep_inputs(module: Any, args: Any, kwargs: Any) -> None:
        _storages((args, kwargs), saved)

    for module in model.modules():
        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    for block in recomputed:
        handles.append(block.register_forward_pre_hook(keep_inputs, with_kwargs=True))

    def pack(tensor: Any) -> Any:
        ptr = tensor.untyped_storage().data_ptr()
        weight = (tensor.is_leaf and tensor.requires_grad) or (running and ptr in running[-1])
        if not weight:
            saved.setdefault(ptr, tensor.untyped_storage().nbytes())
        return tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            result = forward()
    finally:
        for handle in handles:
            handle.remove()
    return result, sum(saved.values())


def state_bytes(model: Any, optimizer: Any) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes this rank holds."""
    import torch

    def local(tensor: Any) -> int:
        tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return tensor.numel() * tensor.element_size()

    params = list(model.parameters())
    state = sum(local(v) for p in params for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return sum(local(p) for p in params), sum(local(p.grad) for p in params if p.grad is not None), state


def _batch(plan: Any, family: Any, rows: int, seq: int, generator: Any, clip: tuple[str, int, int, int, int]) -> tuple[dict[str, Any], Callable[[Any, dict[str, Any]], Any]]:
    """A random batch of the model's shape and the kit's loss on it (``clip``: a diffusion
    pack's folder, frames, height, width, caption rows)."""
    from pathlib import Path

    import torch

    if plan.kind == "vlm":
        ids = torch.randint(0, plan.shape.vocab, (rows, seq), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}, family.loss_sum
    from mmcore.kits.diffusion.objectives import FLOW_MATCHING, diffusion_loss
    from mmcore.kits.diffusion.sections import FlowMatchingTraining

    from mmcore.plan.model import latent_grid

    cfg = plan.model.config
    folder, frames, height, width, caption = clip
    grid, _ = latent_grid(Path(folder), frames, height, width)
    batch = {"latents": torch.randn(rows, cfg.in_channels, *grid, generator=generator), "text": torch.randn(rows, caption, cfg.text_dim, generator=generator)}
    training = FlowMatchingTraining()
    return batch, lambda model, b: diffusion_loss(FLOW_MATCHING, family.predict, model, b["latents"], b["text"], torch.zeros_like(b["text"][0]), training)


def _split_row(model: Any, family: Any, seq: int, sequence: Any, generator: Any) -> tuple[dict[str, Any], Callable[[Any, dict[str, Any]], Any]]:
    """``parallel.ulysses``: one packed text row of ``seq`` tokens (the same on every rank of the
    group), the decoder split as the VLM kit's recipe splits it, and the loss of this rank's slice."""
    import functools

    import torch

    from mmcore.backends.ulysses import shard_labels, shard_loss_sum, sharded, use_ulysses
    from mmcore.train.attention import packed_attention_forward, use_packed_attention, varlen_attention

    use_packed_attention(model, varlen_attention)
    use_ulysses(model, functools.partial(packed_attention_forward, kernel=varlen_attention))
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (seq,), generator=generator)
    no_media = {"pad_id": 0, **dict.fromkeys(family.tokens, -1)}  # text only: no id is a media placeholder
    batch = shard_labels(family.collate([{"input_ids": ids, "labels": ids.clone()}], no_media, pack=True), sequence.rank, sequence.size)

    def loss(model: Any, batch: dict[str, Any]) -> Any:
        with sharded(sequence):
            return shard_loss_sum(family.forward_logits(model, batch), batch)

    return batch, loss


def measure(
    pack: str,
    model_dir: str,
    *,
    seq: int = 0,
    frames: int = 0,
    height: int = 0,
    width: int = 0,
    caption: int = 8,
    rows: int = 1,
    recompute: str = "none",
    freeze: Sequence[str] = (),
    bf16: bool = False,
    ulysses: int = 1,
) -> dict[str, Any]:
    """One training step of ``pack``'s model on this process (of a torchrun world or alone):
    the measured figures beside the plan's for the same layout; fp32 as the engine runs on the
    CPU, or ``bf16`` (``training.precision: bf16``: FSDP2's mixed precision, one process sharding
    over a group of its own, as the engine does); ``ulysses``: a VLM's packed row split over
    sequence groups of that many processes (``parallel.ulysses``; ``rows`` is then 1)."""
    import torch
    import torch.distributed as dist

    from mmcore.backends.fsdp2 import FSDP2Backend
    from mmcore.config.sections import TrainingSection
    from mmcore.plan.devices import DEVICES
    from mmcore.plan.layouts import Layout, estimate
    from mmcore.plan.model import family_of, planned
    from mmcore.train.optim import build_optimizer
    from mmcore.train.recompute import apply_recompute

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    elif bf16 and not dist.is_initialized():  # the engine's own group for a sharded single process
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank() if dist.is_initialized() else 0
    plan = planned(pack, model_dir, seq=seq, frames=frames, height=height, width=width, caption=caption, freeze=freeze)
    _, _, family = family_of(pack)
    torch.manual_seed(0)
    from pathlib import Path

    model = family.build_model(Path(model_dir)).train()
    from mmcore.kits import blocks_at
    from mmcore.train.optim import freeze as freeze_params

    freeze_params(model, list(freeze), family.freeze_groups)
    blocks = blocks_at(model, family.shard_layers)
    apply_recompute(blocks, recompute)
    backend = FSDP2Backend()
    backend.world, backend.sharding, backend.device = SimpleNamespace(world_size=world), world > 1 or bf16, torch.device("cpu")
    model = backend._shard(model, blocks, bf16=bf16, offload=False, replicate=1)  # the engine's sharding
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], TrainingSection())
    if ulysses > 1:
        from mmcore.backends.ulysses import SequenceGroup

        batch, loss_of = _split_row(model, family, seq, SequenceGroup.create(rank, world, ulysses), torch.Generator().manual_seed(rank // ulysses))
    else:
        batch, loss_of = _batch(plan, family, rows, seq, torch.Generator().manual_seed(rank), (model_dir, frames, height, width, caption))
    loss, activations = saved_activation_bytes(model, lambda: loss_of(model, batch), blocks if recompute != "none" else ())
    loss.backward()
    optimizer.step()
    params, grads, opt = state_bytes(model, optimizer)
    from mmcore.kits.diffusion.flops import denoiser_flops

    engine_flops = (family.step_flops() if plan.kind == "vlm" else (family.flops or denoiser_flops)())(model, batch) / ulysses  # as the recipes count
    layout = Layout(shard=world // ulysses, sp=ulysses, recompute=recompute != "none")
    predicted = estimate(plan, layout, DEVICES["h100"], micro_batch=rows, global_batch=rows * world // ulysses, bf16=bf16, runtime=0)
    return {
        "rank": rank,
        "world": world,
        "recompute": recompute,
        "bf16": bf16,
        "ulysses": ulysses,
        "measured": {"weights": params, "grads": grads, "optimizer": opt, "activations": activations},
        "predicted": {"weights": predicted.weights, "grads": predicted.grads, "optimizer": predicted.optimizer, "activations": predicted.activations},
        "engine_flops": engine_flops,
        "plan_flops": plan.flops(rows) / ulysses,
    }


def printed_results(text: str) -> list[dict[str, Any]]:
    """The JSON objects ranks of ``python -m mmcore.plan.measure`` printed to one pipe (two
    ranks' lines may share a line of it)."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        obj, end = decoder.raw_decode(text, at)
        found.append(obj)
        at = text.find("{", end)
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True)
    p.add_argument("--model", required=True)
    for name in ("seq", "frames", "height", "width"):
        p.add_argument(f"--{name}", type=int, default=0)
    p.add_argument("--caption", type=int, default=8)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--recompute", default="none", choices=["none", "full"])
    p.add_argument("--bf16", action="store_true", help="training.precision: bf16 (FSDP2 mixed precision)")
    p.add_argument("--ulysses", type=int, default=1, help="parallel.ulysses: sequence groups of this many processes (a VLM's packed row)")
    p.add_argument("--freeze", action="append", default=[], help="training.freeze: a pack group or a glob (repeatable)")
    args = p.parse_args(argv)
    result = measure(
        args.pack,
        args.model,
        seq=args.seq,
        frames=args.frames,
        height=args.height,
        width=args.width,
        caption=args.caption,
        rows=args.rows,
        recompute=args.recompute,
        freeze=args.freeze,
        bf16=args.bf16,
        ulysses=args.ulysses,
    )
    print(json.dumps(result), flush=True)
    import torch.distributed as dist

    if dist.is_initialized():  # FACTS: barrier, destroy, flush, exit (gloo's exit-time abort)
        dist.barrier()
        dist.destroy_process_group()
        os._exit(0)


if __name__ == "__main__":
    main()
