"""The benchmark suite: runs every benchmark in ``bench/`` in turn, each in its own process with
the same thread count, and writes ``bench/results.json`` (every figure, the machine, the
commit) and ``BENCHMARKS.md`` (the table a person reads).

    make bench          # everything at full size (~35 min on 2 cores)
    make bench-quick    # smaller sizes, fewer repetitions (~5 min): a smoke run, not the record
    python bench/suite.py [--quick] [--only engine_overhead,convert_speed] [--threads 2]
    python bench/suite.py --carry NAMES --carry-from OLD.json --why "..."   # no run: rows kept from OLD

A benchmark that fails is a row saying so (the suite carries on and exits non-zero at the end).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import FIGURE_PREFIX, THREAD_VARIABLES, machine, parser

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# (script, what it covers, arguments in quick mode, or None: skipped there, too big for ~5 min)
BENCHMARKS: list[tuple[str, str, list[str] | None]] = [
    ("engine_overhead", "1. engine overhead vs a bare PyTorch loop", ["--cases", "qwen2vl,wan"]),
    ("convert_speed", "2. conversion speed and memory vs cp", []),
    ("packing", "3. packing vs pad-to-longest", []),
    ("caches", "4. feature caches vs live encoders (demo sizes)", ["--packs", "wan"]),
    ("whisper_encoder_cache", "4. whisper encoder cache at real size", []),
    ("vision_tower_cache", "4. Qwen2-VL vision tower cache at the 2B model's widths", []),
    ("data_path", "5. data path: preprocess rate, batch wait share", ["--packs", "qwen2vl"]),
    ("startup", "6. start-up and environment creation", []),
    ("sharded_load_memory", "7. sharded loading memory, 1 vs 2 ranks", None),
    ("activation_memory", "7. recompute and packed-attention memory", ["--only", "attention"]),
    ("megatron_memory", "7. megatron backend memory: loading, and writing the trained weights, TP=2 and PP=2 vs one process", None),
    ("batched_generation", "issue 16: batched generation vs one request at a time", []),
    ("tower_balance", "issue 40: tower work across data-parallel ranks, balanced vs plain shuffling", []),
    ("grpo_rollouts", "issue 44: GRPO rollouts, a group per generate() call vs one answer at a time; sampling's share of a step", []),
    ("plan_accuracy", "issue 46: mmcore plan's per-rank memory vs a measured step (1 and 2 processes)", []),
    ("peers", "issue 47: the same small training jobs through mmcore, LLaMA-Factory and transformers Trainer scripts", ["--cases", "qwen2vl"]),
]
#: benchmarks whose figures are exact counts of a plan (no timing): the same on any machine, so a
#: partial rerun of these alone merges into results taken on another CPU
EXACT = {"tower_balance", "plan_accuracy"}
#: benchmarks that measure every side of each figure themselves, in the same run on one machine
#: (bench/peers.py): a partial rerun of these on another CPU merges too, its line naming that machine
SAME_RUN = {"peers", "grpo_rollouts"}


def run_one(script: str, extra: list[str], threads: int, quick: bool, timeout: float) -> tuple[list[dict[str, Any]], str | None, float]:
    env = {**os.environ, **{name: str(threads) for name in THREAD_VARIABLES}, "MMCORE_BENCH_THREADS": str(threads)}
    cmd = [sys.executable, str(HERE / f"{script}.py"), "--threads", str(threads), *(["--quick"] if quick else []), *extra]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:.0f} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    figures = [{**json.loads(line[len(FIGURE_PREFIX) :]), "benchmark": script} for line in proc.stdout.splitlines() if line.startswith(FIGURE_PREFIX)]
    for line in proc.stderr.splitlines():
        if line.startswith("# "):
            print(f"  {line[2:]}", flush=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        return figures, f"exit {proc.returncode}: {tail[:300]}", seconds
    return figures, None, seconds


def commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return (proc.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def number(value: float | None) -> str:
    if value is None:
        return "–"
    if value == 0 or 0.01 <= abs(value) < 10000:
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{value:.3g}"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{'make bench-quick' if results['quick'] else 'make bench'}` (`bench/suite.py`) on {results['date']} at commit `{results['commit']}` "
        f"in {results['duration_s'] / 60:.1f} min; every figure also in `bench/results.json`.",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} dispatching to **{m['torch_isa']}**, {results['threads']} threads on both sides, Python {m['python']}"
        + (f", GPU {m['cuda']}" if m.get("cuda") else ", no GPU")
        + ".",
        *[
            f"Rerun since: {', '.join(r['benchmarks'])} on {r['date']} at `{r['commit']}`"
            + (f", {r['threads']} thread(s) on both sides" if r.get("threads", results["threads"]) != results["threads"] else "")
            + (f", on another machine: {r['machine']}" if r.get("machine") else "")
            + "."
            for r in results.get("reruns", [])
        ],
        *[
            f"Not rerun, carried over ({c['why']}): {c['benchmark']} from {c['date']} at `{c['commit']}`"
            + (f", on {c['machine']}" if c.get("machine") else "")
            + (f", {c['threads']} thread(s) on both sides" if c.get("threads") not in (None, results["threads"]) else "")
            + "."
            for c in results.get("carried", [])
        ],
        "",
        "Each figure is a ratio against a baseline measured in the same run: each repetition measures both sides (alternating, after warm-up);",
        "**ratio** is the median of the repetitions' ratios, with their interquartile range. mmcore and baseline columns are medians.",
        "Speed figures on a 2-core virtual machine move by 10–20 % from run to run (disk and neighbours); read the ratios, not the seconds.",
        "",
        "| figure | what | mmcore | baseline | ratio (IQR) | goal | |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in results["figures"]:
        ratio = "–" if f["ratio"] is None else f"{number(f['ratio'])}" + ("" if not f["iqr"] or f["iqr"][0] == f["iqr"][1] else f" ({number(f['iqr'][0])}–{number(f['iqr'][1])})")
        ratio_is = "" if f["ratio"] is None else f" {f['ratio_is']}"
        goal = "–" if not f["goal"] else f"{'value' if f.get('goal_of') == 'mmcore' else 'ratio'} {f['goal'][0]} {f['goal'][1]:g}"
        met = {True: "met", False: "**missed**", None: ""}[f["met"]]
        base = "–" if f["baseline"] is None else f"{number(f['baseline'])} {f['unit']} ({f['baseline_name']})"
        lines.append(f"| `{f['id']}` | {f['what']} | {number(f['mmcore'])} {f['unit']} | {base} | {ratio}{ratio_is} | {goal} | {met} |")
    for failure in results["failures"]:
        lines.append(f"| `{failure['benchmark']}` | {failure['covers']} | not measured | | | | **failed**: {failure['error']} |")
    for skipped in results["skipped"]:
        lines.append(f"| `{skipped['benchmark']}` | {skipped['covers']} | not run: {skipped['why']} | | | | |")
    lines += ["", "## How each figure was measured", ""]
    for f in results["figures"]:
        extra = "; ".join(f"{k} = {v}" for k, v in f.get("extra", {}).items())
        lines.append(f"- `{f['id']}`: {f['how']}" + (f" ({extra})" if extra else "") + ".")
    if any(f["id"].startswith("peers/") for f in results["figures"]):
        from peers import NOTES

        lines += ["", "## Peers: what each side was", "", NOTES.strip()]
    lines += ["", "The scripts' docstrings say what each side runs; `python bench/<name>.py --help` runs one alone.", ""]
    return "\n".join(lines)


def carry(results: dict[str, Any], old: dict[str, Any], names: list[str], why: str) -> None:
    """``names``' rows taken from ``old`` (an earlier results.json) into ``results`` in place of
    whatever this run has for them, each with where and when ``old`` measured it."""
    for name in names:
        source = next((r for r in reversed(old.get("reruns", [])) if name in r["benchmarks"]), None)
        machine = (source or {}).get("machine") or "{cpu}, {cores} cores, torch dispatching to {torch_isa}".format(**old["machine"])
        results["figures"] = [f for f in results["figures"] if f.get("benchmark") != name] + [f for f in old["figures"] if f.get("benchmark") == name]
        results["failures"] = [f for f in results["failures"] if f["benchmark"] != name] + [f for f in old["failures"] if f["benchmark"] == name]
        date, commit_ = (source["date"], source["commit"]) if source else (old["date"], old["commit"])
        threads = (source or {}).get("threads", old.get("threads"))
        carried = [c for c in results.get("carried", []) if c["benchmark"] != name]
        results["carried"] = [*carried, {"benchmark": name, "date": date, "commit": commit_, "machine": machine, "threads": threads, "why": why}]
    order = {name: i for i, (name, _, _) in enumerate(BENCHMARKS)}
    results["figures"].sort(key=lambda f: order.get(f.get("benchmark", ""), len(order)))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one benchmark may take")
    p.add_argument("--markdown", default=str(REPO / "BENCHMARKS.md"))
    p.add_argument("--json", default=str(HERE / "results.json"))
    p.add_argument("--carry", default="", help="comma-separated benchmark names: no run; their rows in --json replaced by --carry-from's")
    p.add_argument("--carry-from", help="an earlier results.json (e.g. from git show)")
    p.add_argument("--why", default="not rerun", help="why they were carried over (said in BENCHMARKS.md)")
    args = p.parse_args()
    if args.carry:
        results = json.loads(Path(args.json).read_text())
        carry(results, json.loads(Path(args.carry_from).read_text()), [n for n in args.carry.split(",") if n], args.why)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        Path(args.markdown).write_text(markdown(results))
        return
    only = [name for name in args.only.split(",") if name]
    unknown = [name for name in only if name not in {b for b, _, _ in BENCHMARKS}]
    if unknown:
        raise SystemExit(f"--only: no benchmark named {', '.join(unknown)} (have: {', '.join(b for b, _, _ in BENCHMARKS)})")
    started = time.perf_counter()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results: dict[str, Any] = {
        "date": now,
        "commit": commit(),
        "quick": args.quick,
        "threads": args.threads,
        "machine": machine(args.threads),
        "figures": [],
        "failures": [],
        "skipped": [],
        "seconds": {},
        "reruns": [],
    }
    previous = Path(args.json)
    if only and previous.exists():
        # a partial rerun replaces those benchmarks' rows in the last results and says so
        old = json.loads(previous.read_text())
        here = results["machine"]
        if old.get("quick") == args.quick and (old.get("machine", {}).get("cpu") == here["cpu"] or set(only) <= EXACT | SAME_RUN):
            if set(only) <= EXACT | SAME_RUN:
                results["machine"] = old["machine"]  # the table's timings stay the other machine's
            results.update({k: old[k] for k in ("date", "commit", "figures", "failures", "skipped", "seconds", "reruns", "threads", "carried") if k in old})
            results["carried"] = [c for c in results.get("carried", []) if c["benchmark"] not in only]  # measured again now
            results["machine"]["threads"] = results["threads"]  # the table's header is the first run's; a rerun's own count goes on its line
            results["figures"] = [f for f in results["figures"] if f.get("benchmark") not in only]
            results["failures"] = [f for f in results["failures"] if f["benchmark"] not in only]
            results["skipped"] = [f for f in results["skipped"] if f["benchmark"] not in only and f["benchmark"] not in ("gpu_step", "gpu_megatron")]
            rerun = {"benchmarks": only, "date": now, "commit": commit(), "threads": args.threads}
            if here["cpu"] != results["machine"]["cpu"] and not set(only) <= EXACT:
                rerun["machine"] = f"{here['cpu']}, {here['cores']} cores, torch dispatching to {here['torch_isa']}"
            results["reruns"] = [*results.get("reruns", []), rerun]
            results["previous_duration_s"] = old.get("duration_s", 0)
    for script, covers, quick_args in BENCHMARKS:
        if only and script not in only:
            continue
        if args.quick and quick_args is None:
            results["skipped"].append({"benchmark": script, "covers": covers, "why": "too big for bench-quick (make bench runs it)"})
            continue
        print(f"[bench] {script}: {covers}", flush=True)
        figures, error, seconds = run_one(script, quick_args if args.quick else [], args.threads, args.quick, args.timeout)
        results["figures"] += figures
        results["seconds"][script] = round(seconds, 1)
        if error:
            print(f"  FAILED: {error}", flush=True)
            results["failures"].append({"benchmark": script, "covers": covers, "error": error})
    order = {name: i for i, (name, _, _) in enumerate(BENCHMARKS)}
    results["figures"].sort(key=lambda f: order.get(f.get("benchmark", ""), len(order)))  # stable: a benchmark's rows keep their order
    if not results["machine"]["cuda"]:  # bench/gpu_step.py records its own figures where a GPU is lent
        results["skipped"].append(
            {"benchmark": "gpu_step", "covers": "8. one-GPU step: tokens/s, MFU, peak memory vs transformers + FSDP2", "why": "no CUDA device on this machine (run bench/gpu_step.py on one)"}
        )
        results["skipped"].append(
            {
                "benchmark": "gpu_megatron",
                "covers": "8. megatron backend on one GPU: bf16 + Megatron's distributed optimizer vs mmcore's fp32 step, MFU",
                "why": "no CUDA device on this machine (run bench/gpu_megatron.py on one)",
            }
        )
    results["duration_s"] = round(time.perf_counter() - started + results.pop("previous_duration_s", 0), 1)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    Path(args.markdown).write_text(markdown(results))
    missed = [f["id"] for f in results["figures"] if f["met"] is False]
    print(
        f"[bench] {len(results['figures'])} figures, {len(missed)} goals missed{': ' + ', '.join(missed) if missed else ''}, "
        f"{len(results['failures'])} failed; {args.markdown}, {args.json} ({results['duration_s'] / 60:.1f} min)",
        flush=True,
    )
    sys.exit(1 if results["failures"] else 0)


if __name__ == "__main__":
    main()
