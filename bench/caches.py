"""Feature caches: train step time from the extract stage's cache vs running the frozen part
every step, on each pack's demo (``mmcore run --pack P --preset demo``), same session.

* wan: VAE latents and text embeddings cached vs encoded every step;
* whisper: the frozen encoder's outputs (``training.freeze=[encoder]``);
* qwen2vl: the frozen vision tower's features (``training.freeze=[vision]``);
* qwen2.5omni: the frozen audio and vision towers' outputs (``training.freeze=[audio,vision]``).

Each pack runs twice in a scratch folder (same config but ``extract.enabled``), ``--steps``
steps each; the steady-state steps (first ``--warmup`` dropped) are split into ``--reps``
consecutive blocks, and the figure is the median over blocks of live / cached mean step time.
The two runs' losses are compared too (they compute the same thing).

Only wan's row has a goal (>= 3): its demo's frozen VAE and text encoder are most of a step, as
at real sizes. The towers of the whisper, qwen2vl and qwen2.5omni demos are a small share of
their steps by the demos' design, so those rows are records: what a cache saves at a real size
is measured where that size runs, ``bench/whisper_encoder_cache.py`` (whisper-base, goal >= 3)
and ``bench/vision_tower_cache.py`` (Qwen2-VL-2B's widths, goal: the FLOP count's ratio).

    python bench/caches.py [--quick] [--packs wan,whisper,qwen2vl,qwen2.5omni] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from common import emit, figure, parser, pin_threads, reps_of

PACKS = {  # pack: (overrides both runs share, what the cache replaces)
    "wan": ([], "VAE + text encoder"),
    "whisper": (["training.freeze=[encoder]"], "frozen audio encoder"),
    "qwen2vl": (["training.freeze=[vision]"], "frozen vision tower"),
    "qwen2.5omni": (["training.freeze=[audio,vision]"], "frozen audio + vision towers"),
}


STAGES = ("download", "convert", "preprocess", "extract", "train", "export")


def run(folder: Path, pack: str, name: str, steps: int, overrides: list[str], until: str = "train") -> Path:
    """The pack's stages up to ``until``, as a user runs them one by one (export is not timed)."""
    for stage in STAGES[: STAGES.index(until) + 1]:
        cmd = [
            sys.executable,
            "-m",
            "mmcore",
            stage,
            "--pack",
            pack,
            "--preset",
            "demo",
            "--run-dir",
            name,
            f"training.steps={steps}",
            "training.eval_every=0",
            "training.checkpoint_every=0",
            "training.log_every=1",
            *overrides,
        ]
        proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{pack} {name} {stage} failed:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return folder / name


def steps_of(run_dir: Path) -> tuple[list[float], list[float]]:
    rows = [json.loads(x) for x in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    return [r["step_time_s"] for r in rows], [r["loss"] for r in rows]


def blocks(values: list[float], n: int) -> list[float]:
    size = len(values) // n
    return [sum(values[i * size : (i + 1) * size]) / size for i in range(n)]


def demo_run_options(doc: str | None, packs: Sequence[str], steps: int, quick_steps: int, warmup: int) -> tuple[argparse.Namespace, int, int]:
    """(options, repetitions, train steps) of a benchmark that runs packs' demos; threads pinned."""
    p = parser(doc)
    p.add_argument("--packs", default=",".join(packs))
    p.add_argument("--steps", type=int, default=None, help=f"train steps per run (default {steps}, quick {quick_steps})")
    p.add_argument("--warmup", type=int, default=warmup, help="first steps dropped")
    args = p.parse_args()
    pin_threads(args.threads)
    return args, reps_of(args), args.steps or (quick_steps if args.quick else steps)


def main() -> None:
    args, reps, steps = demo_run_options(__doc__, list(PACKS), steps=40, quick_steps=16, warmup=3)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for pack in args.packs.split(","):
            overrides, replaced = PACKS[pack]
            cached = run(Path(tmp), pack, f"{pack}-cached", steps, overrides)
            live = run(Path(tmp), pack, f"{pack}-live", steps, [*overrides, "extract.enabled=false"])
            (tc, lc), (tl, ll) = steps_of(cached), steps_of(live)
            extract_s = json.loads((cached / "extract/manifest.json").read_text())["duration_s"]
            emit(
                figure(
                    f"caches/{pack}",
                    f"{pack} demo train step: {replaced} from the cache vs run every step",
                    "s/step",
                    blocks(tc[args.warmup :], reps),
                    blocks(tl[args.warmup :], reps),
                    baseline_name=f"{replaced} every step",
                    ratio_is="baseline/mmcore",
                    goal=(">=", 3.0) if pack == "wan" else None,
                    how=f"{steps} steps per run, first {args.warmup} dropped, {reps} consecutive blocks, {args.threads} threads, demo preset sizes",
                    extract_once_s=round(extract_s, 2),
                    max_loss_rel_diff=max(abs(a - b) / abs(b) for a, b in zip(lc, ll)),
                )
            )


if __name__ == "__main__":
    main()
