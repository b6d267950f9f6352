"""Training from the extract cache vs. encoding every batch (the wan demo setup), same session.

    python bench/wan_cache_speedup.py [--steps 40]

Runs `mmcore run --pack wan --preset demo` twice in a temporary folder, once with the cache and
once with extract.enabled=false, and reports the mean step time of each (first step excluded),
the ratio, and the one-off cost of the extract stage. Also checks the losses are the same.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(folder: Path, name: str, steps: int, *extra: str) -> Path:
    cmd = [sys.executable, "-m", "mmcore", "run", "--pack", "wan", "--preset", "demo", "--run-dir", name, f"training.steps={steps}", "export.sample_prompts=[]", *extra]
    subprocess.run(cmd, cwd=folder, check=True, capture_output=True)
    return folder / name


def step_times(run_dir: Path) -> tuple[list[float], list[float]]:
    rows = [json.loads(x) for x in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    return [r["step_time_s"] for r in rows], [r["loss"] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cached = run(folder, "cached", args.steps)
        fresh = run(folder, "fresh", args.steps, "extract.enabled=false")
        (tc, lc), (tf, lf) = step_times(cached), step_times(fresh)
        extract_s = json.loads((cached / "extract/manifest.json").read_text())["duration_s"]
        mean_c, mean_f = sum(tc[1:]) / len(tc[1:]), sum(tf[1:]) / len(tf[1:])
        print(json.dumps({
            "steps": args.steps,
            "cached_step_s": round(mean_c, 4),
            "on_the_fly_step_s": round(mean_f, 4),
            "speedup": round(mean_f / mean_c, 2),
            "extract_once_s": extract_s,
            "max_loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(lc, lf)),
        }))


if __name__ == "__main__":
    main()
