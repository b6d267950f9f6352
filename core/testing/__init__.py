"""Test helpers for mmcore and for packs: fixtures (a pytest plugin) and the conformance suite.

Installed as the pytest plugin ``mmcore`` (entry point ``pytest11``), so a pack's tests get
the fixtures without importing anything. Pack authors subclass
:class:`mmcore.testing.conformance.PackConformance` to run the standard tests on their pack.
"""

from __future__ import annotations

from mmcore.framework.facade import lazy_exports

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from mmcore.config import Layer, RunConfig, build_config, overrides_layer
from mmcore.framework.plugins import Plugins
from mmcore.run.rundir import RunDir
from mmcore.run.runner import Runner
from mmcore.run.session import config_class, preset_layer


def plugins_with(*packs: Any, installed_packs: bool = False) -> Plugins:
    """A fresh plugin world: the infrastructure plugins plus exactly ``packs``.

    Each item is a pack object (its ``PACK.name`` is used), a bare :class:`~mmcore.PackSpec`,
    or a ``(name, object)`` pair.
    """
    from mmcore.framework.pack import PackSpec

    pairs: list[tuple[str, Any]] = []
    for item in packs:
        if isinstance(item, tuple):
            pairs.append(item)
        else:
            pairs.append((item.name if isinstance(item, PackSpec) else item.PACK.name, item))
    plugins = Plugins.load(extra_packs=pairs, installed_packs=installed_packs)
    for name, _ in pairs:
        plugins.pack(name)  # raise now, with the reason, if the pack did not register
    return plugins


def make_config(plugins: Plugins, pack: str, *, preset: str | None = None, values: dict[str, Any] | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """The pack's config from its preset (default preset if None), ``values`` and ``overrides``."""
    entry = plugins.pack(pack)
    assert entry.spec is not None
    layers: list[Layer] = []
    preset = preset or entry.spec.default_preset
    if preset:
        layers.append(preset_layer(entry, preset))
    if values:
        layers.append(Layer("test values", values))
    overrides = list(overrides)
    if overrides:
        layers.append(overrides_layer(overrides))
    return build_config(config_class(entry), layers)


def make_runner(plugins: Plugins, pack: str, run_dir: str | Path, **config_kw: Any) -> Runner:
    """A :class:`Runner` for ``pack`` in ``run_dir`` (config as in :func:`make_config`)."""
    config = make_config(plugins, pack, **config_kw)
    rd = RunDir(run_dir)
    rd.root.mkdir(parents=True, exist_ok=True)
    from mmcore.config import dump_config

    dump_config(config, rd.config_path)
    if rd.read_run_json() is None:  # what `mmcore` writes, so the CLI accepts the directory too
        from mmcore.framework.files import atomic_write_json

        atomic_write_json(rd.run_json_path, {"pack": pack, "preset": config_kw.get("preset"), "config_file": None, "overrides": list(config_kw.get("overrides", [])), "created_at": 0})
    return Runner(plugins, pack, config, rd)


def preprocessed(pack: str, run_dir: Path, data_file: Path, *, preset: str = "tiny") -> Any:
    """``data_file`` as the user's dataset of ``pack`` (its ``preset``), through download,
    convert and preprocess in ``run_dir``, in process; returns the preprocessed
    :class:`~mmcore.data.ShardDataset`."""
    from mmcore.data import ShardDataset

    runner = make_runner(Plugins.load(), pack, run_dir, preset=preset, overrides=[f"data.datasets=[{data_file}]"])
    for stage in ("download", "convert", "preprocess"):
        runner.run_stage(stage)
    return ShardDataset(Path(run_dir) / "preprocess/dataset")


class StageCLI:
    """Runs ``python -m mmcore ARGS`` in ``cwd`` as a user would; raises with both streams on failure.

    ``MMCORE_*`` variables of the calling environment are dropped, so a test sets exactly the
    ones it means (``MMCORE_TEST_KILL=train-step:2``).
    """

    def __init__(self, cwd: Path, timeout: float = 900) -> None:
        self.cwd = cwd
        self.timeout = timeout

    def __call__(self, *args: str, check: bool = True, **env: str) -> Any:
        import os
        import subprocess
        import sys

        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
        full_env.update(env)
        proc = subprocess.run([sys.executable, "-m", "mmcore", *args], cwd=self.cwd, env=full_env, capture_output=True, text=True, timeout=self.timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"mmcore {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc


def run_nodes(cwd: Path, args: Sequence[str], nnodes: int = 2, *, order: Sequence[int] | None = None, timeout: float = 600, env: Mapping[str, str] | None = None) -> list[Any]:
    """``python -m mmcore ARGS`` as ``nnodes`` simulated nodes on loopback (one process each,
    started in ``order``, one rendezvous); returns their completed processes in node order, each
    with what it printed. When one node fails, or ``timeout`` passes, the nodes still running are
    killed (returncode -9) so the caller sees every node's output instead of a hang.
    ``env``: the processes' environment (default: this one without ``MMCORE_*`` variables)."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from mmcore.run.launch import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    env = dict(env) if env is not None else {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
    with tempfile.TemporaryDirectory(prefix="mmcore-nodes-") as logs:
        streams = {rank: (open(Path(logs) / f"{rank}.out", "w+"), open(Path(logs) / f"{rank}.err", "w+")) for rank in range(nnodes)}
        procs = {
            rank: subprocess.Popen(
                [sys.executable, "-m", "mmcore", *args, "--nnodes", str(nnodes), "--node-rank", str(rank), "--rdzv-endpoint", endpoint],
                cwd=cwd,
                env=env,
                stdout=streams[rank][0],
                stderr=streams[rank][1],
                text=True,
            )
            for rank in (order if order is not None else range(nnodes))
        }
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                codes = [proc.poll() for proc in procs.values()]
                if all(code is not None for code in codes) or any(code not in (None, 0) for code in codes):
                    break
                time.sleep(0.5)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        done = []
        for rank in sorted(procs):
            out, err = streams[rank]
            out.seek(0), err.seek(0)
            done.append(subprocess.CompletedProcess(procs[rank].args, procs[rank].returncode, out.read(), err.read()))
            out.close(), err.close()
    return done


def train_losses(run_dir: Path) -> dict[int, float]:
    """Step -> loss of a run's ``train/metrics.jsonl`` (a resumed run repeats steps: the last counts)."""
    import json

    rows = [json.loads(line) for line in (Path(run_dir) / "train/metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def stage_manifest(run_dir: Path, stage: str) -> dict[str, Any]:
    """A stage's ``manifest.json`` in a run directory."""
    import json

    return json.loads((Path(run_dir) / stage / "manifest.json").read_text())


def cache_matches_on_the_fly(cli: Any, run_root: Path, args: Sequence[str]) -> None:
    """``mmcore run ARGS`` (3 steps, held-out loss at step 3) from the extract stage's feature
    cache and again encoding every batch during training (``extract.enabled=false``):
    bit-identical losses and held-out loss. Bit-identical by construction: both run directories
    preprocess the same bytes, and extract and the on-the-fly path call the same frozen encoders
    on one clip or caption at a time, in processes with the same threads and kernels."""
    common = [*args, "training.steps=3", "training.eval_every=3", "evaluate.enabled=false"]
    cli("run", *common, "--run-dir", "cached")
    cli("run", *common, "--run-dir", "fresh", "extract.enabled=false")
    cached, fresh = train_losses(run_root / "cached"), train_losses(run_root / "fresh")
    assert list(cached) == [1, 2, 3] and fresh == cached
    assert stage_manifest(run_root / "fresh", "train")["metrics"].get("eval/loss") == stage_manifest(run_root / "cached", "train")["metrics"].get("eval/loss")


def diffusion_demo_holds(
    cli: Any, run_root: Path, pack: str, samples: int | None = None, *, sensitivity: float | None = None, agreement: float | None = None, condition_sensitivity: float | None = None
) -> Path:
    """``mmcore run --pack PACK`` (its demo) in ``run_root/demo``, then the diffusion demos'
    promise as the READMEs state it: the held-out loss at fixed noise below 0.6x its start at the
    end (``tools/demo_matrix.py`` holds the "by 60 % of the steps on any machine" part), the
    export's weights bit-identical to training, and ``samples`` samples (None: one per held-out
    clip, at least one) with a contact sheet from evaluate; where given, the held-out ``caption_sensitivity`` (loss with another clip's
    caption over the loss with its own) at least ``sensitivity`` and evaluate's
    ``caption_agreement`` (samples showing what their caption says) at least ``agreement``; for
    a family conditioned on more than its caption (image-to-video), the held-out
    ``condition_sensitivity`` (loss with another clip's first frame over the loss with its own)
    at least ``condition_sensitivity``. Returns the run directory for the pack's own checks."""
    cli("run", "--pack", pack, "--run-dir", "demo")
    run = Path(run_root) / "demo"
    train = stage_manifest(run, "train")["metrics"]
    assert train["eval/loss"] < 0.6 * train["eval/loss@0"], train
    assert stage_manifest(run, "export")["metrics"]["weights_identical"]
    evaluate = stage_manifest(run, "evaluate")["metrics"]
    assert evaluate["samples"] == samples if samples is not None else evaluate["samples"] >= 1, evaluate
    assert (run / "evaluate/samples/contact_sheet.png").stat().st_size > 500
    if sensitivity is not None:
        assert train["eval/caption_sensitivity"] >= sensitivity, train
    if agreement is not None:
        assert evaluate["caption_agreement"] >= agreement, evaluate
    if condition_sensitivity is not None:
        assert train["eval/condition_sensitivity"] >= condition_sensitivity, train
    return run


def two_processes_match_one(cli: Any, run_root: Path, args: Sequence[str], rel: float = 1e-5) -> None:
    """``mmcore run ARGS`` on one process (micro-batches of 2) and on two (of 1 each, the same
    global batch): three steps, equal losses to ``rel`` (fp32; only the reduction order differs),
    and the two-process run's export reloading with identical logits (or, a diffusion pipeline,
    identical weights). ``cli`` runs ``mmcore``
    in ``run_root`` (the ``mmcore_cli`` fixture)."""
    import pytest

    cli("run", *args, "training.steps=3", "--run-dir", "one", "training.micro_batch_size=2")
    proc = cli("run", *args, "training.steps=3", "--run-dir", "two", "training.micro_batch_size=1", "--nproc-per-node", "2")
    assert stage_manifest(run_root / "two", "train")["world_size"] == 2
    assert "returned a view tensor" not in proc.stderr, proc.stderr  # FSDP2's warning: no view leaves the sharded root (plugins/fsdp2.py)
    one, two = train_losses(run_root / "one"), train_losses(run_root / "two")
    assert list(one) == list(two) == [1, 2, 3]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=rel), step
    export = stage_manifest(run_root / "two", "export")["metrics"]
    # a model export reloads with identical logits; a diffusion pipeline's denoiser bit for bit
    assert export["logits_max_abs_diff"] == 0.0 if "logits_max_abs_diff" in export else export["weights_identical"], export


def infer_answers_held_out(cli: Any, run_root: Path, run_dir: str = "demo", count: int = 12, checkpoints: Sequence[str] = ("latest", "export")) -> None:
    """``mmcore infer --input`` on the first ``count`` held-out conversations of a demo run
    (``<run>/preprocess/demo-data/eval.json``), from each of ``checkpoints``: the answers must be
    the records' assistant turns. ``cli`` runs ``mmcore`` in ``run_root``."""
    import json

    demo = run_root / run_dir / "preprocess/demo-data"
    held_out = json.loads((demo / "eval.json").read_text())[:count]
    (demo / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    for which in checkpoints:
        cli("infer", "--run-dir", run_dir, "--checkpoint", which, "--input", str(demo / "requests.jsonl"), "--output", f"{which}.jsonl")
        answers = [json.loads(line) for line in (run_root / f"{which}.jsonl").read_text().splitlines()]
        assert [a["text"] for a in answers] == [r["messages"][1]["content"] for r in held_out], which


__all__ = ["preprocessed", "train_losses", "stage_manifest", "two_processes_match_one", "infer_answers_held_out", "plugins_with", "make_config", "make_runner", "StageCLI", "run_nodes"]


#: the SDK names of this façade -> the module that defines each (:mod:`mmcore.sdk`)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("PackConformance",), "mmcore.testing.conformance"),
    **dict.fromkeys(
        (
            "crash_chain",
            "declined_stages",
            "differences",
            "losses",
            "points_for",
            "run_args",
            "run_mmcore",
            "straight_run",
        ),
        "mmcore.testing.crash",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
