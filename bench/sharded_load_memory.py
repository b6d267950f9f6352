"""Peak host memory per rank while loading a model for training, and after one step: the engine's
way (built on meta, sharded, each rank reads its shards) vs the previous way (every rank builds
the full fp32 model, loads every weight, then shards), on 1 and 2 processes (gloo, CPU).

The model is Qwen2-VL-2B-shaped (real widths and vocabulary, tied embedding) with as many layers as
let the previous way's one-rank fp32 step (weights, gradients, AdamW) fit in 24 GiB: 6 decoder
layers, 8 vision blocks. Its checkpoint is written once by convert's own ``hf_to_dcp`` (DCP,
``model.*``, fp32, each tensor alone in a file, the tied weight stored once).

    python bench/sharded_load_memory.py [--workdir DIR]

Goal (issue 13): per-rank load peak <= checkpoint / world + import baseline + 2 x largest tensor.
Prints its figures for bench/suite.py; figures go into BENCHMARKS.md and notes, never tests.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from pathlib import Path

from common import emit, figure, parser

SHAPE = dict(
    text_config=dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
    ),
    vision_config=dict(depth=8, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4),
    tie_word_embeddings=True,
)


def peak_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the parent that spawned it)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(meta: bool) -> object:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from mmcore.checkpoint.sharded_load import parameters_on_meta

    config = Qwen2VLConfig(**SHAPE)
    config._attn_implementation = "sdpa"
    if meta:
        with parameters_on_meta():
            return Qwen2VLForConditionalGeneration(config)
    return Qwen2VLForConditionalGeneration(config)


def write_checkpoint(folder: Path) -> tuple[int, int, int]:
    """Convert's checkpoint of the random model at ``folder``: its hub safetensors through
    ``hf_to_dcp``, as the convert stage writes it (each tensor alone in a file). Returns
    (checkpoint bytes, largest tensor bytes, largest layer's or block's bytes)."""
    import re
    import shutil

    import torch

    from mm_pack_qwen2vl.adapter import ADAPTER
    from mmcore.engines.convert import hf_to_dcp

    torch.manual_seed(0)
    model = build(meta=False)
    hub = folder.with_name(folder.name + ".hub")
    model.save_pretrained(hub)
    sizes = {k: v.numel() * v.element_size() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    layers: dict[str, int] = {}
    for name, size in sizes.items():  # a layer or block: up to the first number in the name, as the megatron loader groups them
        found = re.match(r"^.*?\.\d+\.", name)
        if found:
            layers[found.group(0)] = layers.get(found.group(0), 0) + size
    del model
    hf_to_dcp(hub, folder, ADAPTER)
    shutil.rmtree(hub)
    return sum(sizes.values()), max(sizes.values()), max(layers.values())


def worker(rank: int, world: int, port: int, way: str, folder: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from mmcore.checkpoint.training import load_converted
    from mmcore.checkpoint.sharded_load import load_weights, materialise

    import transformers  # noqa: F401  (imports belong to the baseline)

    dist.init_process_group("gloo", rank=rank, world_size=world)
    baseline = peak_mib()
    t0 = time.perf_counter()
    if way == "engine":
        model = build(meta=True)
        for block in [*model.model.visual.blocks, *model.model.language_model.layers]:
            fully_shard(block)
        fully_shard(model)
        materialise(model, torch.device("cpu"))
        load_weights(model, Path(folder), distributed=True)
    else:
        model = build(meta=False)
        load_converted(model, Path(folder))
        for block in [*model.model.visual.blocks, *model.model.language_model.layers]:
            fully_shard(block)
        fully_shard(model)
    load_s = time.perf_counter() - t0
    after_load = peak_mib()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=False)
    ids = torch.randint(0, 151936, (1, 256), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    optimizer.step()
    after_step = peak_mib()
    with open(out, "a") as handle:
        handle.write(
            json.dumps({"way": way, "world": world, "rank": rank, "baseline_mib": round(baseline), "load_peak_mib": round(after_load), "step_peak_mib": round(after_step), "load_s": round(load_s, 1)})
            + "\n"
        )
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = parser(__doc__).parse_args()
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        total, largest, _ = write_checkpoint(work / "ckpt")
        out = work / "results.jsonl"
        for way in ("previous", "engine"):
            for world in (1, 2):
                mp.start_processes(worker, args=(world, free_port(), way, str(work / "ckpt"), str(out)), nprocs=world, start_method="spawn")
        rows = [json.loads(line) for line in out.read_text().splitlines()]

    def worst(way: str, world: int, key: str) -> dict:
        return max((r for r in rows if r["way"] == way and r["world"] == world), key=lambda r: r[key])

    how = (
        f"Qwen2-VL-2B widths, 6 decoder layers, 8 vision blocks, fp32 checkpoint {total / 2**20:.0f} MiB (largest tensor {largest / 2**20:.0f} MiB), "
        "gloo on CPU, each rank a fresh process, peak RSS of the worst rank; one measurement (memory is deterministic)"
    )
    for world in (1, 2):
        engine, previous = worst("engine", world, "load_peak_mib"), worst("previous", world, "load_peak_mib")
        bound = engine["baseline_mib"] + total / world / 2**20 + 2 * largest / 2**20
        emit(
            figure(
                f"sharded_load/{world}-rank-peak-vs-bound",
                f"load peak per rank, {world} rank(s), against imports + checkpoint/world + 2 x largest tensor",
                "MiB",
                [engine["load_peak_mib"]],
                [bound],
                baseline_name="the bound",
                goal=("<=", 1.0),
                how=how,
                load_s=engine["load_s"],
            )
        )
        emit(
            figure(
                f"sharded_load/{world}-rank-peak-vs-previous",
                f"load peak per rank, {world} rank(s): meta build + shard-wise load vs full build + load + shard",
                "MiB",
                [engine["load_peak_mib"]],
                [previous["load_peak_mib"]],
                baseline_name="full model on every rank",
                how=how,
                load_s=engine["load_s"],
                previous_load_s=previous["load_s"],
            )
        )
    one, two = worst("engine", 1, "load_peak_mib"), worst("engine", 2, "load_peak_mib")
    emit(
        figure(
            "sharded_load/2-vs-1-rank-above-imports",
            "load peak above imports per rank: 2 ranks vs 1 (ideal 0.5 plus a tensor or two)",
            "MiB",
            [two["load_peak_mib"] - two["baseline_mib"]],
            [one["load_peak_mib"] - one["baseline_mib"]],
            baseline_name="1 rank",
            how=how,
        )
    )


if __name__ == "__main__":
    main()
