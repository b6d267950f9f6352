"""Peak host memory per rank while the megatron backend builds and loads its part of a model
(``parallel.backend: megatron``): one process (TP=1) against two at TP=2 and at PP=2, gloo on CPU.

Each rank builds only its part (megatron-core's layers, uninitialised) and fills it from convert's
checkpoint one decoder layer at a time (:func:`mmcore.megatron.engine.load_rank`), so a rank
should hold its shard plus one layer's whole tensors: the decoder ~ 1 / (TP x PP) of it, the
vision tower whole on the first stage (replicated over TP), and at PP=2 the tied embedding on
both stages (the last one's output layer is a copy of it, as Megatron keeps it). On top of that,
while a tensor is read, DCP's reader holds its stored bytes and the tensor decoded from them
beside the whole tensor they are copied into (then cut for TP): the bound is what the rank keeps
+ 3 x the largest tensor.

The model is Qwen2-VL-2B-shaped (its widths and vocabulary, tied embedding) with 6 decoder
layers and 8 vision blocks, as ``sharded_load_memory.py``'s; the checkpoint is written once as
convert writes one (DCP, ``model.*``, fp32).

    python bench/megatron_load_memory.py [--workdir DIR]

Prints its figures for bench/suite.py; figures go into BENCHMARKS.md and notes, never tests.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from common import emit, figure, parser
from sharded_load_memory import SHAPE, free_port, peak_mib, write_checkpoint

LAYOUTS = ((1, 1), (2, 1), (1, 2))  # (TP, PP); the world is their product


def worker(rank: int, world: int, port: int, tp: int, pp: int, model_dir: str, checkpoint: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch.distributed as dist

    from mm_pack_qwen2vl.megatron import megatron_family
    from mmcore.megatron.engine import Layout, load_rank
    from mmcore.megatron.gpt import init_model_parallel

    dist.init_process_group("gloo", rank=rank, world_size=world)
    family = megatron_family(Path(model_dir))
    init_model_parallel(tp, pp, seed=0)
    layout = Layout.current()
    baseline = peak_mib()  # imports and groups: what any rank pays before its model
    start = time.perf_counter()
    model = family.build(layout)
    built = peak_mib()
    load_rank(model, family, Path(checkpoint), layout)
    load_s = time.perf_counter() - start
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values() if hasattr(t, "numel")) / 2**20
    with open(out, "a") as handle:
        handle.write(json.dumps({"tp": tp, "pp": pp, "rank": rank, "baseline_mib": round(baseline), "build_peak_mib": round(built),
                                 "load_peak_mib": round(peak_mib()), "held_mib": round(held), "load_s": round(load_s, 1)}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    args = parser(__doc__).parse_args()
    import sys
    import tempfile

    from mmcore.megatron import status

    usable, why = status()
    if not usable:
        print(f"# megatron_load_memory skipped: {why}", file=sys.stderr)
        return

    import torch.multiprocessing as mp
    from transformers import Qwen2VLConfig

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        Qwen2VLConfig(**SHAPE).save_pretrained(work / "model")
        total, largest = write_checkpoint(work / "ckpt")
        out = work / "results.jsonl"
        for tp, pp in LAYOUTS:
            mp.start_processes(worker, args=(tp * pp, free_port(), tp, pp, str(work / "model"), str(work / "ckpt"), str(out)), nprocs=tp * pp, start_method="spawn")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        print(f"# megatron_load_memory rank: {json.dumps(row)}", file=sys.stderr)

    def worst(tp: int, pp: int) -> dict:
        return max((r for r in rows if (r["tp"], r["pp"]) == (tp, pp)), key=lambda r: r["load_peak_mib"] - r["baseline_mib"])

    def above_imports(row: dict) -> float:
        return row["load_peak_mib"] - row["baseline_mib"]

    how = (f"Qwen2-VL-2B widths, 6 decoder layers, 8 vision blocks, tied embedding, fp32 checkpoint {total / 2**20:.0f} MiB (largest tensor "
           f"{largest / 2**20:.0f} MiB), megatron-core local spec, gloo on CPU, each rank a fresh process, peak RSS above imports of the worst rank; "
           "one measurement (peaks move by ~10 % between runs with the allocator's timing)")
    # DCP's reader holds a stored tensor's bytes and the tensor it decodes from them while it
    # copies into the whole tensor the table then cuts: three of the largest tensor on top of what
    # the rank keeps (the rank whose ratio is worst is shown)
    def ratio(r: dict) -> float:
        return above_imports(r) / (r["held_mib"] + 3 * largest / 2**20)

    one = worst(1, 1)
    for tp, pp in LAYOUTS:
        row = max((r for r in rows if (r["tp"], r["pp"]) == (tp, pp)), key=ratio)
        name = "one process" if tp * pp == 1 else (f"TP={tp}" if tp > 1 else f"PP={pp}")
        tag = name.lower().replace("=", "").replace(" ", "-")
        emit(figure(f"megatron_load/{tag}-peak-vs-bound", f"{name}: build + load peak above imports against the tensors the rank keeps + 3 x the largest "
                    "tensor (DCP's reader decodes a tensor beside its bytes, into a whole one before the TP cut)", "MiB", [above_imports(row)],
                    [row["held_mib"] + 3 * largest / 2**20], baseline_name="the bound", goal=("<=", 1.0), how=how, rank=row["rank"],
                    held_mib=row["held_mib"], excess_in_largest_tensors=round((above_imports(row) - row["held_mib"]) / (largest / 2**20), 2), load_s=row["load_s"]))
        row = worst(tp, pp)
        if tp * pp > 1:
            emit(figure(f"megatron_load/{tag}-vs-one-process", f"build + load peak above imports per rank, {name} vs one process (the decoder halves; the vision "
                        "tower stays whole on the first stage; at PP=2 the last stage reads the tied embedding for its output layer)", "MiB",
                        [above_imports(row)], [above_imports(one)], baseline_name="one process", how=how,
                        held_mib=row["held_mib"], one_process_held_mib=one["held_mib"], load_s=row["load_s"]))


if __name__ == "__main__":
    main()
