"""The crash matrix: kill a real ``mmcore run`` at named crash points, rerun, and check that
nothing was lost: the resumed run's export is bit-identical to an uninterrupted one, every
training step's loss equals the uninterrupted run's, and the train manifest's final loss too.

Crash points (:func:`mmcore.framework.faults.crash_point`, selected with ``MMCORE_TEST_KILL=<tag>:<n>``):

* ``<stage>-start``, ``<stage>-done``: around every stage's work (the runner), ``-done`` after
  the outputs exist and before the manifest is written;
* ``convert-tensor:<n>``: while the converted checkpoint is written;
* ``shard-write:<n>``: after a preprocess/extract shard is written, before the index;
* ``extract-chunk:<n>``: after a feature-cache chunk;
* ``train-step:<n>``: after step n (and its checkpoint, when one is due);
* ``checkpoint-write:<n>``: inside step n's checkpoint, after the tensors, before it is complete;
* ``checkpoint-link:<n>``: after step n's checkpoint is complete and ``latest`` moved, before
  older ones are pruned;
* ``trained-piece:<n>``: on ``parallel.backend: megatron``, while a rank writes the n-th piece of
  the trained weights (not in the default list: FSDP2 runs have no such write; ``--point``);
* ``train-end``: after the final checkpoint, before the stage returns;
* ``safetensors-tensor``: after the first tensor of an exported safetensors file.

:func:`crash_chain` kills one run at each point of a list in turn (every rerun resumes what the
previous one left: a second and third resume, the final step after a resume), then lets it
finish; ``python -m mmcore.testing.crash --pack P`` runs every point of every pack separately
(``make crash-matrix``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from mmcore.framework.pack import STAGES


def points_for(stages: Sequence[str], steps: int, declined: Sequence[str] = ()) -> list[str]:
    """Every crash point a pipeline of ``stages`` passes, in the order a run meets them, chosen
    so that each is met again by the run that resumes the previous kill (``steps`` >= 4).
    A stage the pack ``declined`` for this config only passes its start and done points."""
    points: list[str] = []
    for stage in STAGES:
        if stage not in stages:
            continue
        if stage in declined:
            points += [f"{stage}-start", f"{stage}-done"]
        elif stage == "convert":
            points += ["convert-start", "convert-tensor:2", "convert-done"]
        elif stage == "preprocess":
            points += ["preprocess-start", "shard-write:1", "preprocess-done"]
        elif stage == "extract":
            points += ["extract-start", "extract-chunk:1", "extract-done"]
        elif stage == "train":
            points += [
                "train-start",
                "train-step:1",  # a resume from step 1
                "checkpoint-write:2",  # a half-written checkpoint beside a complete one
                "checkpoint-link:2",  # complete, latest moved, the older not yet pruned
                f"train-step:{steps - 1}",  # a third resume
                f"checkpoint-write:{steps}",  # the final checkpoint, half written
                "train-end",  # the final checkpoint complete, the stage not returned
                "train-done",  # returned, no manifest: the rerun resumes at the last step
            ]
        elif stage == "export":
            points += ["export-start", "safetensors-tensor", "export-done"]
        else:
            points += [f"{stage}-start", f"{stage}-done"]
    return points


@dataclass
class Attempt:
    point: str
    returncode: int
    seconds: float
    tail: str


def run_mmcore(cwd: Path, args: Sequence[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
    full["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "mmcore", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


def run_args(pack: str, preset: str, run_dir: Path, overrides: Sequence[str]) -> list[str]:
    return ["run", "--pack", pack, "--preset", preset, "--run-dir", str(run_dir), *overrides]


def crash_chain(cwd: Path, pack: str, preset: str, run_dir: Path, overrides: Sequence[str], points: Sequence[str], *, timeout: float = 1800) -> list[Attempt]:
    """Kill ``mmcore run`` at each point in turn, then run it to the end. Raises AssertionError
    when a run was not killed at its point (never reached) or the final run fails."""
    attempts = []
    for point in points:
        start = time.perf_counter()
        proc = run_mmcore(cwd, run_args(pack, preset, run_dir, overrides), {"MMCORE_TEST_KILL": point}, timeout)
        attempts.append(Attempt(point, proc.returncode, time.perf_counter() - start, (proc.stdout + proc.stderr)[-2000:]))
        # one process dies of the signal itself; under torchrun (parallel.nproc_per_node > 1) the
        # killed rank's launcher says so (mmcore.run.torchrun) and the run fails
        if proc.returncode != -signal.SIGKILL and not (proc.returncode != 0 and "was killed by SIGKILL" in proc.stderr):
            raise AssertionError(f"crash point {point}: expected the run to be killed there, it exited {proc.returncode}:\n{attempts[-1].tail}")
    start = time.perf_counter()
    proc = run_mmcore(cwd, run_args(pack, preset, run_dir, overrides), {}, timeout)
    attempts.append(Attempt("(none)", proc.returncode, time.perf_counter() - start, (proc.stdout + proc.stderr)[-2000:]))
    if proc.returncode != 0:
        raise AssertionError(f"the run after the kills failed ({proc.returncode}):\n{attempts[-1].tail}")
    return attempts


def processes_of(run_dir: Path) -> list[int]:
    """The pids of live processes whose command line names ``run_dir`` (Linux's /proc)."""
    needle = str(Path(run_dir).absolute()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # ended while we looked
                continue
    return sorted(found)


def kill_process_group(cwd: Path, args: Sequence[str], ready: Callable[[], bool], *, env: dict[str, str] | None = None, timeout: float = 1800) -> list[int]:
    """Start ``mmcore <args>`` as a scheduler or terminal would (a process group of its own),
    wait until ``ready()``, kill the whole group with SIGKILL and return the pids of the run's
    processes that were alive at the kill (the launcher, torchrun's agent, the workers).
    Raises AssertionError when the run ends before it is ready."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
    full["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    full.update(env or {})
    # output to a file, not a pipe: a process that outlives the kill would hold a pipe open
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mmcore", *args], cwd=cwd, env=full, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while not ready():
                if proc.poll() is not None:
                    log.seek(0)
                    raise AssertionError(f"the run ended ({proc.returncode}) before it was to be killed:\n{log.read()[-2000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"the run was not ready to be killed after {timeout:.0f} s")
                time.sleep(0.05)
            alive = [proc.pid, *processes_of(Path(args[args.index("--run-dir") + 1]))]
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return sorted(set(alive))


def survivors(pids: Sequence[int], wait: float = 5.0) -> list[int]:
    """Those of ``pids`` still alive (not zombies) after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def straight_run(cwd: Path, pack: str, preset: str, run_dir: Path, overrides: Sequence[str], *, timeout: float = 1800) -> None:
    proc = run_mmcore(cwd, run_args(pack, preset, run_dir, overrides), {}, timeout)
    if proc.returncode != 0:
        raise AssertionError(f"the uninterrupted run failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def declined_stages(run: Path) -> list[str]:
    from mmcore.run.rundir import RunDir

    return [stage for stage in STAGES if (m := RunDir(run).read_manifest(stage)) is not None and m.status == "declined"]


def _files(folder: Path) -> dict[str, bytes]:
    from mmcore.framework.files import iter_files

    root = folder.resolve()
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in iter_files(root)}


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}  # a resumed step logs again: keep the last


def differences(straight: Path, resumed: Path) -> list[str]:
    """What a resumed run lost or changed compared with the uninterrupted one (empty: nothing)."""
    from mmcore.run.rundir import RunDir

    problems = []
    for stage in STAGES:
        a, b = RunDir(straight).read_manifest(stage), RunDir(resumed).read_manifest(stage)
        if a is None:
            continue
        if b is None or b.status != a.status:
            problems.append(f"{stage}: {'no manifest' if b is None else b.status} after resuming")
            continue
    if (straight / "train").is_dir():
        la, lb = losses(straight), losses(resumed)
        if la != lb:
            steps = [s for s in sorted(set(la) | set(lb)) if la.get(s) != lb.get(s)]
            problems.append(f"train: losses differ at steps {steps[:5]}: {[la.get(s) for s in steps[:3]]} vs {[lb.get(s) for s in steps[:3]]}")
        fa = RunDir(straight).read_manifest("train")
        fb = RunDir(resumed).read_manifest("train")
        if fa and fb and json.dumps(fa.metrics.get("final_loss")) != json.dumps(fb.metrics.get("final_loss")):
            problems.append(f"train: final_loss {fb.metrics.get('final_loss')} after resuming, {fa.metrics.get('final_loss')} uninterrupted")
    export = RunDir(straight).read_manifest("export")
    if export is not None:
        resumed_export = RunDir(resumed).read_manifest("export")
        if resumed_export is not None:
            # a file that names its run folder (a PEFT adapter's base model path) names the other one
            here, there = str(Path(resumed).resolve()).encode(), str(Path(straight).resolve()).encode()
            for output in sorted(set(export.outputs) | set(resumed_export.outputs)):  # the model, and a LoRA run's adapter
                if output not in export.outputs or output not in resumed_export.outputs:
                    problems.append(f"export: output {output!r} in only one of the runs")
                    continue
                fa_, fb_ = _files(export.output(output)), _files(resumed_export.output(output))
                fb_ = {name: data.replace(here, there) for name, data in fb_.items()}
                if fa_.keys() != fb_.keys():
                    problems.append(f"export {output}: files differ: {sorted(fa_.keys() ^ fb_.keys())[:5]}")
                else:
                    changed = [name for name in fa_ if fa_[name] != fb_[name]]
                    if changed:
                        problems.append(f"export {output}: {len(changed)} file(s) not bit-identical: {changed[:5]}")
    leftovers = [p.name for p in Path(resumed).glob(".*.replaced")] + [str(p.relative_to(resumed)) for p in Path(resumed).rglob("*.incomplete")]
    if leftovers:
        problems.append(f"left behind: {leftovers[:5]}")
    return problems


# --------------------------------------------------------------------------- make crash-matrix


def process_group_trial(cwd: Path, pack: str, preset: str, straight: Path, run_dir: Path, overrides: Sequence[str]) -> list[str]:
    """Kill ``mmcore run``'s whole process group once training has checkpointed step 2 (rank 0
    held there, alive, so the kill lands in training on any machine), rerun at once; what was
    lost or outlived the kill (empty: nothing)."""
    checkpoint = run_dir / "train" / "checkpoints" / "step-00000002" / "trainer_state.json"
    args = run_args(pack, preset, run_dir, overrides)
    pids = kill_process_group(cwd, args, checkpoint.is_file, env={"MMCORE_TEST_STALL": "train-step:2@0"})
    proc = run_mmcore(cwd, args, {}, 1800)
    if proc.returncode != 0:
        return [f"the rerun failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-300:]}"]
    outlived = survivors(pids, wait=0)
    problems = [f"processes outlived the kill: {outlived}"] if outlived else []
    if "resumed from step 2" not in proc.stdout:
        problems.append("the rerun did not resume from step 2's checkpoint")
    return problems + differences(straight, run_dir)


def _process_group_trial(work: Path, pack: str, straight: Path, overrides: Sequence[str]) -> bool:
    start = time.perf_counter()
    try:
        problems = process_group_trial(work, pack, "tiny", straight, work / pack / "process-group", overrides)
    except AssertionError as exc:
        problems = [str(exc).splitlines()[0]]
    print(f"{pack:<12} {'process group':<22} {'FAILED' if problems else 'ok':<7} {time.perf_counter() - start:6.1f}" + (f"  {problems[0]}" if problems else ""), flush=True)
    return not problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m mmcore.testing.crash")
    parser.add_argument("--pack", action="append", help="pack(s) to run (default: every installed pack with a tiny preset)")
    parser.add_argument("--work", default="crash-matrix", help="folder for the runs (deleted first)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--point", action="append", help="only these points")
    parser.add_argument(
        "--process-group",
        action="store_true",
        help="instead of the crash points: kill each run's whole process group (as a scheduler does) after step 2's checkpoint, rerun at once, and check that no process outlived the kill",
    )
    parser.add_argument("--override", action="append", default=None, help="config overrides of every run (default: data.demo_samples=4, the packs' demo data, kept small)")
    args = parser.parse_args(argv)

    from mmcore.framework.plugins import Plugins

    plugins = Plugins.load()
    packs = args.pack or sorted(name for name, entry in plugins.packs.items() if entry.spec is not None and "tiny" in entry.spec.presets)
    work = Path(args.work).absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    failures = 0
    print(f"{'pack':<12} {'point':<22} {'result':<7} seconds")
    for pack in packs:
        overrides = ["convert.verify=false", f"training.steps={args.steps}", "training.checkpoint_every=1", *(args.override if args.override is not None else ["data.demo_samples=4"])]
        straight = work / pack / "straight"
        straight_run(work, pack, "tiny", straight, overrides)
        if args.process_group:
            failures += not _process_group_trial(work, pack, straight, overrides)
            continue
        for point in args.point or points_for(plugins.implemented_stages(pack), args.steps, declined_stages(straight)):
            run_dir = work / pack / point.replace(":", "-")
            start = time.perf_counter()
            try:
                crash_chain(work, pack, "tiny", run_dir, overrides, [point])
                problems = differences(straight, run_dir)
            except AssertionError as exc:
                problems = [str(exc).splitlines()[0]]
            failures += bool(problems)
            print(f"{pack:<12} {point:<22} {'FAILED' if problems else 'ok':<7} {time.perf_counter() - start:6.1f}" + (f"  {problems[0]}" if problems else ""), flush=True)
            if not problems:
                shutil.rmtree(run_dir, ignore_errors=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
