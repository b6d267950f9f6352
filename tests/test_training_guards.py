"""Training that goes wrong stops (``training.on_nonfinite``): the FSDP2 train engine on a
four-weight linear model, in-process. A loss that overflows, a weight update that overflows and
a sample that holds a nan each meet the guard for real; no number is faked."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from mmcore import PackSpec, Stage, StageResult
from mmcore.errors import MmcoreError
from mmcore.run.rundir import RunDir
from mmcore.testing import make_runner, plugins_with
from mmcore.train.loop import TrainRecipe


def download(ctx, upstream):  # type: ignore[no-untyped-def]
    (ctx.stage_dir / "model").mkdir()
    return StageResult(outputs={"model": "model"})


def recipe(ctx, upstream):  # type: ignore[no-untyped-def]
    import torch

    rows = [[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5], [2.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    if ctx.config.run.name == "nan-sample":
        rows[2][1] = math.nan  # one bad sample in the data set
    # a loss with no minimum and small inputs: AdamW moves each weight by lr every step, one way,
    # and the loss stays finite while the weights grow past float32's 3.4e38
    unbounded = ctx.config.run.name == "unbounded"
    if unbounded:
        rows = [[v * 1e-6 for v in row] for row in rows]

    def build(ctx, upstream):  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        return torch.nn.Linear(4, 1, bias=False)

    def collate(samples):  # type: ignore[no-untyped-def]
        x = torch.tensor(samples)
        return {"x": x, "y": x.sum(dim=1, keepdim=True), "num_loss_tokens": len(samples)}

    counted = ctx.config.run.name == "counted"  # 8 FLOPs a sample, for the tflops and mfu metrics
    return TrainRecipe(
        build_model=build,
        dataset=lambda ctx, up: rows,
        collate=collate,
        loss=lambda model, batch: model(batch["x"]).sum() if unbounded else ((model(batch["x"]) - batch["y"]) ** 2).sum(),
        flops=(lambda model, batch: 8.0 * len(batch["x"])) if counted else None,
    )


PACK = PackSpec(name="linear", stages={"download": "test_training_guards:download", "train": Stage("mmcore.train.loop:train_stage", parts={"recipe": "test_training_guards:recipe"})})


def train(run: Path, *overrides: str):  # type: ignore[no-untyped-def]
    runner = make_runner(plugins_with(PACK), "linear", run, overrides=["training.lr_schedule=constant", "training.checkpoint_every=1", *overrides])
    runner.run_stage("download")
    return runner.run_stage("train")


def steps_saved(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "train/checkpoints").glob("step-*"))


def test_a_loss_that_overflows_stops_at_its_step_keeping_the_last_good_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(MmcoreError) as info:
        train(run, "training.lr=1e30", "training.steps=5")  # step 1 moves the weights to ~1e30: step 2's loss is inf
    line = info.value.one_line()
    kept = run / "train/checkpoints/step-00000001"
    assert line.startswith(f"training stopped at step 2: the loss is inf; no update was made and the last checkpoint, {kept}, is kept"), line
    assert "lower training.lr, or set training.on_nonfinite: skip" in line and "\n" not in line
    assert steps_saved(run) == ["step-00000001"]
    assert RunDir(run).read_manifest("train") is None  # not a finished run


def test_an_update_that_overflows_the_weights_is_never_saved(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(MmcoreError) as info:  # past float32's 3.4e38 in about 12 steps
        train(run, "run.name=unbounded", "training.lr=3e37", "training.steps=30")
    found = re.fullmatch(
        r"training stopped at step (\d+): the weights are no longer finite \(an update overflowed\), so they were not saved; "
        r"the last checkpoint, (\S+), is kept \(hint: .*\)",
        info.value.one_line(),
    )
    assert found, info.value.one_line()
    step = int(found.group(1))
    assert found.group(2) == str(run / f"train/checkpoints/step-{step - 1:08d}") and steps_saved(run)[-1] == f"step-{step - 1:08d}"


def test_skip_leaves_out_the_nan_step_and_counts_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(run, "run.name=nan-sample", "training.on_nonfinite=skip", "training.steps=4", "training.lr=0.01")  # one epoch: the nan sample once
    metrics = RunDir(run).read_manifest("train").metrics
    assert metrics["skipped_steps"] == 1 and math.isfinite(metrics["final_loss"]), metrics
    assert steps_saved(run)[-1] == "step-00000004"


def test_stop_is_the_default_for_a_nan_sample(tmp_path: Path) -> None:
    with pytest.raises(MmcoreError, match=r"training stopped at step \d: the loss is nan; no update was made"):
        train(tmp_path / "run", "run.name=nan-sample", "training.steps=4", "training.lr=0.01")


def test_a_stopped_run_keeps_every_row_logged_before_the_bad_step(tmp_path: Path) -> None:
    # no checkpoint, a run shorter than a second: the loop still holds its rows (it hands them to
    # the sinks in bursts, mmcore.train.metric_log) when the guard stops it; they must reach the file
    import json

    run = tmp_path / "run"
    with pytest.raises(MmcoreError) as info:
        train(run, "run.name=nan-sample", "training.steps=4", "training.lr=0.01", "training.checkpoint_every=0", "run.seed=1")  # seed 1: the nan sample comes third
    stopped = int(re.match(r"training stopped at step (\d+)", info.value.one_line()).group(1))  # type: ignore[union-attr]
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    assert stopped > 1 and [r["step"] for r in rows] == list(range(1, stopped)), rows
    times = [r["time"] for r in rows]
    assert times == sorted(times) and all(math.isfinite(r["loss"]) for r in rows)


def test_each_row_has_the_steps_flop_rate_and_its_share_of_the_stated_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("MMCORE_PEAK_TFLOPS", "1e-9")  # a device of 1000 FLOP/s: asked once a run, used every step
    train(tmp_path / "run", "run.name=counted", "training.steps=3")
    rows = [json.loads(line) for line in (tmp_path / "run/train/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # one sample a step (micro_batch_size 1): 8 FLOPs in step_time_s
        assert r["tflops"] == pytest.approx(8.0 / r["step_time_s"] / 1e12, rel=1e-6) and r["mfu"] == pytest.approx(r["tflops"] * 1e12 / 1e3, rel=1e-9)
