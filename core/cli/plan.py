"""``mmcore plan``: per-rank memory and step time of candidate cluster layouts, before renting
the cluster (:mod:`mmcore.plan`). Reads configs only: no weights, no device."""

from __future__ import annotations

import click


@click.command("plan")
@click.option("--pack", "-p", required=True, help="The pack (model family).")
@click.option("--model", required=True, help="A local folder, a pack's tiny preset (init:tiny), or a hub id (its config files only).")
@click.option("--seq", type=int, default=0, help="VLM packs: decoder tokens per row.")
@click.option("--frames", type=int, default=0, help="Video packs: frames per clip.")
@click.option("--height", type=int, default=0, help="Video/image packs: pixels.")
@click.option("--width", type=int, default=0, help="Video/image packs: pixels.")
@click.option("--caption", type=int, default=512, show_default=True, help="Diffusion packs: caption rows (the text encoder's max length).")
@click.option("--device", "device_name", default="h100", show_default=True, help="h100, h200, a100, 910b.")
@click.option("--nodes", type=int, default=1, show_default=True)
@click.option("--gpus-per-node", type=int, default=8, show_default=True, help="Devices per node.")
@click.option("--micro-batch", type=int, default=1, show_default=True, help="Rows per micro-batch.")
@click.option("--global-batch", type=int, default=0, help="Rows per step, the same for every layout [default: a micro-batch per device].")
@click.option("--freeze", multiple=True, help="training.freeze: a pack group (vision, ...) or a parameter glob (repeatable).")
@click.option("--fp32", is_flag=True, help="fp32 compute (default: bf16 mixed precision, training.precision: bf16).")
@click.option("--top", type=int, default=12, show_default=True, help="Layouts to print.")
def plan_cmd(
    pack: str,
    model: str,
    seq: int,
    frames: int,
    height: int,
    width: int,
    caption: int,
    device_name: str,
    nodes: int,
    gpus_per_node: int,
    micro_batch: int,
    global_batch: int,
    freeze: tuple[str, ...],
    fp32: bool,
    top: int,
) -> None:
    """Predict per-rank memory (weights, gradients, optimizer state, activations with and
    without recompute, buffers), step time and MFU of FSDP/HSDP x TP x PP x SP x recompute x
    offload layouts of MODEL on a cluster, ranked, saying which fit."""
    from mmcore.plan.devices import device_of
    from mmcore.plan.layouts import ranked
    from mmcore.plan.model import planned
    from mmcore.plan.report import render

    device = device_of(device_name)
    plan = planned(pack, model, seq=seq, frames=frames, height=height, width=width, caption=caption, freeze=freeze)
    estimates = ranked(plan, device, nodes, gpus_per_node, micro_batch=micro_batch, global_batch=global_batch, bf16=not fp32)
    click.echo(render(plan, device, nodes, gpus_per_node, estimates, micro_batch=micro_batch, global_batch=global_batch or nodes * gpus_per_node * micro_batch, bf16=not fp32, top=top))


__all__ = ["plan_cmd"]
