"""The data path of each demo: how fast preprocess turns samples into shards, and what share
of a train step the loop spends waiting for its batch (reading shards and collating).

Each pack's demo preset (``--preset demo``) runs download -> train as a user runs it, with
``--steps`` train steps, and once more up to preprocess with ``data.num_workers=2``.
Preprocess: samples (train + held-out) / the stage's duration (which includes writing the
demo's synthetic media, the same on both sides), 2 worker processes vs in-process, one run
each. Wait share: the train loop's ``data_time_s / step_time_s`` per step
(``train/metrics.jsonl``), first ``--warmup`` steps dropped, split into ``--reps`` blocks; the
figure is the median block's share (goal < 0.05).

    python bench/data_path.py [--quick] [--packs qwen2vl,wan,whisper,qwen2.5omni] [--steps 30]
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from caches import blocks, demo_run_options, run
from common import emit, figure

PACKS = ("qwen2vl", "wan", "whisper", "qwen2.5omni")


def main() -> None:
    args, reps, steps = demo_run_options(__doc__, PACKS, steps=30, quick_steps=12, warmup=2)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for pack in args.packs.split(","):
            run_dir = run(Path(tmp), pack, pack, steps, ["data.num_workers=0"])
            two = run(Path(tmp), pack, f"{pack}-2-workers", steps, ["data.num_workers=2"], until="preprocess")
            rows = [json.loads(x) for x in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
            rows = [r for r in rows if "data_time_s" in r][args.warmup :]
            waits, totals = blocks([r["data_time_s"] for r in rows], reps), blocks([r["step_time_s"] for r in rows], reps)
            emit(
                figure(
                    f"data_path/{pack}-wait-share",
                    f"{pack} demo: share of the train step spent waiting for the batch",
                    "s/step",
                    waits,
                    totals,
                    baseline_name="whole step",
                    goal=("<=", 0.05),
                    how=f"demo preset, {steps} steps, first {args.warmup} dropped, {reps} blocks, {args.threads} threads; in-process read + collate",
                )
            )
            rates, samples = [], 0
            for folder in (run_dir, two):
                pre = json.loads((folder / "preprocess/manifest.json").read_text())
                m = pre["metrics"]
                samples = m.get("train_samples", 0) + m.get("eval_samples", 0) or m.get("clips", 0)
                rates.append(samples / pre["duration_s"])
            emit(
                figure(
                    f"data_path/{pack}-preprocess",
                    f"{pack} demo preprocess throughput, data.num_workers=2 vs in-process",
                    "samples/s",
                    [rates[1]],
                    [rates[0]],
                    baseline_name="in-process (num_workers=0)",
                    how=f"{samples} demo samples / the stage's duration, one run each, {args.threads} cores",
                    samples=samples,
                )
            )


if __name__ == "__main__":
    main()
