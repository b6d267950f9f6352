"""What every benchmark shares: its command line, pinned threads, the machine record, and the
figure lines that ``bench/suite.py`` collects into ``bench/results.json`` and ``BENCHMARKS.md``.

A figure is a ratio of mmcore against a baseline measured in the same run: each repetition
measures both sides (alternating, after warm-up), the figure is the median of the repetitions'
ratios with their interquartile range. Figures go into BENCHMARKS.md and notes, never into
tests: a timed assertion fails on a slower machine without anything being wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

FIGURE_PREFIX = "BENCH_FIGURE "

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def parser(description: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--quick`` (smaller, fewer repetitions: the
    ``make bench-quick`` budget), ``--threads``, ``--reps``, ``--workdir``."""
    p = argparse.ArgumentParser(description=(description or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions (make bench-quick)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("MMCORE_BENCH_THREADS", "2")), help="torch threads, the same on both sides")
    p.add_argument("--reps", type=int, default=None, help="repetitions of each measurement (default: 5, quick: 3)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    return p


def reps_of(args: argparse.Namespace) -> int:
    return args.reps or (3 if args.quick else 5)


def pin_threads(n: int) -> None:
    """The same intra-op thread count here and in every child process this benchmark starts."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(n)
    import torch

    torch.set_num_threads(n)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); with fewer than two values all three are it."""
    values = sorted(values)
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclass
class Figure:
    """One row of BENCHMARKS.md.

    Attributes:
        id: ``<benchmark>/<case>``, stable across runs (results are compared by it).
        what: what is measured, in a few words.
        unit: unit of ``mmcore`` and ``baseline`` (medians over repetitions).
        baseline_name: what the baseline is (``bare PyTorch loop``, ``cp``, ``pad to longest``).
        ratio: median over repetitions of each repetition's ratio, oriented as ``ratio_is`` says.
        ratio_is: ``"mmcore/baseline"`` or ``"baseline/mmcore"`` (speed-ups of time measures).
        iqr: interquartile range of the per-repetition ratios.
        goal: ``(">=" | "<=", value)`` for the ratio (or for ``mmcore`` itself where
            ``goal_of`` says so), ``("within", t)``: a ratio within 1 +- t; None where the figure is a record.
        how: how it was measured (sizes, threads, repetitions, warm-up, what both sides run).
    """

    id: str
    what: str
    unit: str
    mmcore: float
    baseline: float | None
    baseline_name: str
    ratio: float | None
    ratio_is: str
    iqr: tuple[float, float] | None
    goal: tuple[str, float] | None
    how: str
    reps: int
    extra: dict[str, Any] = field(default_factory=dict)
    goal_of: str = "ratio"

    @property
    def met(self) -> bool | None:
        measured = self.mmcore if self.goal_of == "mmcore" else self.ratio
        if self.goal is None or measured is None:
            return None
        op, value = self.goal
        if op == "within":  # a ratio that should be 1: within +- value of it
            return abs(measured - 1) <= value
        return measured >= value if op == ">=" else measured <= value


def figure(
    id: str,
    what: str,
    unit: str,
    mmcore: Sequence[float],
    baseline: Sequence[float] | None,
    *,
    baseline_name: str,
    how: str,
    ratio_is: str = "mmcore/baseline",
    goal: tuple[str, float] | None = None,
    goal_of: str = "ratio",
    **extra: Any,
) -> Figure:
    """A figure from paired repetitions: ``mmcore[i]`` and ``baseline[i]`` were measured in the
    same repetition; the ratio is taken per repetition, then summarised."""
    _, mm_median, _ = quartiles(mmcore)
    if baseline is None:
        return Figure(id, what, unit, mm_median, None, baseline_name, None, ratio_is, None, goal, how, len(mmcore), extra, goal_of)
    if len(baseline) != len(mmcore):
        raise ValueError(f"{id}: {len(mmcore)} mmcore repetitions but {len(baseline)} baseline ones")
    if ratio_is == "mmcore/baseline":
        ratios = [m / b for m, b in zip(mmcore, baseline)]
    elif ratio_is == "baseline/mmcore":
        ratios = [b / m for m, b in zip(mmcore, baseline)]
    else:
        raise ValueError(f"{id}: ratio_is must be 'mmcore/baseline' or 'baseline/mmcore', not {ratio_is!r}")
    q1, median, q3 = quartiles(ratios)
    return Figure(id, what, unit, mm_median, quartiles(baseline)[1], baseline_name, median, ratio_is, (q1, q3), goal, how, len(mmcore), extra, goal_of)


def emit(fig: Figure) -> None:
    """Print the figure for the suite (one line, prefixed) and a readable line for a person."""
    row = asdict(fig)
    row["met"] = fig.met
    print(FIGURE_PREFIX + json.dumps(row), flush=True)
    ratio = "" if fig.ratio is None else f" ratio {fig.ratio:.3g} ({fig.ratio_is})"
    if fig.goal is not None:
        ratio += f", goal ({'value' if fig.goal_of == 'mmcore' else 'ratio'}) {fig.goal[0]} {fig.goal[1]:g}: {'met' if fig.met else 'MISSED'}"
    base = "" if fig.baseline is None else f" vs {fig.baseline:.4g} ({fig.baseline_name})"
    print(f"# {fig.id}: {fig.mmcore:.4g} {fig.unit}{base}{ratio}", file=sys.stderr, flush=True)


def machine(threads: int | None = None) -> dict[str, Any]:
    """CPU model, the instruction set torch dispatches to, threads, versions: what a figure
    depends on besides the code."""
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        isa = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # pragma: no cover - older torch
        isa = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_isa": isa,
        "isa_override": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS") if k in os.environ},
        "threads": threads if threads is not None else torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
