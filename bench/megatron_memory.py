"""Peak host memory per rank of the megatron backend's two whole-model moments (``parallel.backend:
megatron``), one process (TP=1) against two at TP=2 and at PP=2, gloo on CPU:

* **load**: each rank builds only its part (megatron-core's layers, uninitialised) and fills it
  from convert's checkpoint one layer (or vision block) at a time
  (:func:`mmcore.backends.megatron.engine.load_rank`); convert writes each tensor alone in a file, which
  is mapped, and :meth:`mmcore.backends.megatron.tensor_map.Rule.shard` copies out the rank's slices only. A
  rank should hold its part (the decoder ~ 1 / (TP x PP) of it, the vision tower whole on the
  first stage, the tied embedding on both stages at PP=2) plus about one layer.
* **write** of the trained weights at the end (:func:`mmcore.backends.megatron.engine.write_trained`):
  every rank writes its own pieces of the hub tensors into one DCP checkpoint
  (:mod:`mmcore.backends.megatron.trained`), against the way before it, in the same processes: every
  rank's part gathered on rank 0, which converts and writes the whole model.

The model is Qwen2-VL-2B-shaped (its widths and vocabulary, tied embedding) with 6 decoder
layers and 8 vision blocks, as ``sharded_load_memory.py``'s; its checkpoint is written once by
convert's own ``hf_to_dcp`` (fp32). Peaks are VmHWM (reset before each write through
``/proc/self/clear_refs``), which counts the pages of mapped files a rank has touched: clean
page-cache pages the kernel can take back, so the figures overstate what a rank must have.

    python bench/megatron_memory.py [--workdir DIR]

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


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """VmHWM back to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def worker(rank: int, world: int, port: int, tp: int, pp: int, model_dir: str, checkpoint: str, work: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import shutil

    import torch.distributed as dist

    from mm_pack_qwen2vl.megatron import megatron_family
    from mmcore.framework.context import WorldInfo
    from mmcore.engines.convert import dcp_index
    from mmcore.backends.megatron.engine import Layout, _write_gathered, load_rank, write_trained
    from mmcore.backends.megatron.gpt import init_model_parallel

    dist.init_process_group("gloo", rank=rank, world_size=world)
    family = megatron_family(Path(model_dir))
    init_model_parallel(tp, pp, seed=0)
    layout = Layout.current()
    index = dcp_index(Path(checkpoint))
    baseline = peak_mib()  # imports and groups: what any rank pays before its model
    start = time.perf_counter()
    model = family.build(layout)
    built = peak_mib()
    load_rank(model, family, Path(checkpoint), layout)
    load_s = time.perf_counter() - start
    loaded = peak_mib()
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values() if hasattr(t, "numel")) / 2**20
    row = {"tp": tp, "pp": pp, "rank": rank, "baseline_mib": round(baseline), "build_peak_mib": round(built), "load_peak_mib": round(loaded), "held_mib": round(held), "load_s": round(load_s, 1)}
    for way in ("pieces", "gathered"):
        folder = Path(work) / f"trained-{way}"
        dist.barrier()
        reset_peak()
        before = rss_mib()
        start = time.perf_counter()
        if way == "pieces":
            write_trained(folder, [model], family, layout, WorldInfo(rank, world, rank, world), index)
        else:
            if rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
            _write_gathered(folder, [model], family, layout)
        dist.barrier()
        row[f"write_{way}_above_model_mib"] = round(peak_mib() - before)
        row[f"write_{way}_s"] = round(time.perf_counter() - start, 1)
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    with open(out, "a") as handle:
        handle.write(json.dumps(row) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    args = parser(__doc__).parse_args()
    import sys
    import tempfile

    from mmcore.backends.megatron import status

    usable, why = status()
    if not usable:
        print(f"# megatron_memory skipped: {why}", file=sys.stderr)
        return

    import torch.multiprocessing as mp
    from transformers import Qwen2VLConfig

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        Qwen2VLConfig(**SHAPE).save_pretrained(work / "model")
        total, largest, layer = write_checkpoint(work / "ckpt")
        out = work / "results.jsonl"
        for tp, pp in LAYOUTS:
            mp.start_processes(worker, args=(tp * pp, free_port(), tp, pp, str(work / "model"), str(work / "ckpt"), str(work), str(out)), nprocs=tp * pp, start_method="spawn")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        print(f"# megatron_memory rank: {json.dumps(row)}", file=sys.stderr)

    def rows_of(tp: int, pp: int) -> list[dict]:
        return [r for r in rows if (r["tp"], r["pp"]) == (tp, pp)]

    def above_imports(row: dict) -> float:
        return row["load_peak_mib"] - row["baseline_mib"]

    how = (
        f"Qwen2-VL-2B widths, 6 decoder layers, 8 vision blocks, tied embedding, fp32 checkpoint {total / 2**20:.0f} MiB (largest tensor "
        f"{largest / 2**20:.0f} MiB, largest layer {layer / 2**20:.0f} MiB) written by convert's hf_to_dcp, megatron-core local spec, gloo on CPU, "
        "each rank a fresh process, VmHWM (mapped file pages included); one measurement (peaks move by ~10 % between runs with the allocator's timing)"
    )

    # while a layer is read its mapped tensors' pages count beside the rank's part: at most the
    # largest tensor (read whole at TP=1) or the largest layer
    def bound(r: dict) -> float:
        return r["held_mib"] + (largest + layer) / 2**20

    one = max(rows_of(1, 1), key=above_imports)
    for tp, pp in LAYOUTS:
        name = "one process" if tp * pp == 1 else (f"TP={tp}" if tp > 1 else f"PP={pp}")
        tag = name.lower().replace("=", "").replace(" ", "-")
        row = max(rows_of(tp, pp), key=lambda r: above_imports(r) / bound(r))
        emit(
            figure(
                f"megatron_load/{tag}-peak-vs-bound",
                f"{name}: build + load peak above imports against the tensors the rank keeps + the largest tensor + the largest layer (what is mapped while a layer is read)",
                "MiB",
                [above_imports(row)],
                [bound(row)],
                baseline_name="the bound",
                goal=("<=", 1.0),
                how=how,
                rank=row["rank"],
                held_mib=row["held_mib"],
                excess_in_largest_tensors=round((above_imports(row) - row["held_mib"]) / (largest / 2**20), 2),
                load_s=row["load_s"],
            )
        )
        row = max(rows_of(tp, pp), key=above_imports)
        if tp * pp > 1:
            emit(
                figure(
                    f"megatron_load/{tag}-vs-one-process",
                    f"build + load peak above imports per rank, {name} vs one process (the decoder halves; the vision "
                    "tower stays whole on the first stage; at PP=2 the last stage holds the tied embedding's copy for its output layer)",
                    "MiB",
                    [above_imports(row)],
                    [above_imports(one)],
                    baseline_name="one process",
                    how=how,
                    held_mib=row["held_mib"],
                    one_process_held_mib=one["held_mib"],
                    load_s=row["load_s"],
                )
            )
        ours, theirs = (max(rows_of(tp, pp), key=lambda r: r[f"write_{way}_above_model_mib"]) for way in ("pieces", "gathered"))
        emit(
            figure(
                f"megatron_write/{tag}-pieces-vs-gathered",
                f"{name}: peak above the loaded model while the trained weights are written, the worst rank: each rank writing its pieces vs everything gathered on rank 0 (the way before)",
                "MiB",
                [ours["write_pieces_above_model_mib"]],
                [theirs["write_gathered_above_model_mib"]],
                baseline_name="gathered on rank 0",
                goal=("<=", 0.5),
                how=how,
                rank_pieces=ours["rank"],
                rank_gathered=theirs["rank"],
                held_mib=ours["held_mib"],
                write_pieces_s=max(r["write_pieces_s"] for r in rows_of(tp, pp)),
                write_gathered_s=max(r["write_gathered_s"] for r in rows_of(tp, pp)),
            )
        )


if __name__ == "__main__":
    main()
