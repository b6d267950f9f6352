"""``training.optimizer`` / ``betas`` / ``eps`` / ``momentum`` and ``training.epochs`` on the FSDP2
train engine, in-process on a linear model: each optimizer trains and resumes (killed for real
with ``MMCORE_TEST_KILL`` in a child process) to the losses of an unbroken run; epochs count
what the sampler deals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmcore import PackSpec, Stage, StageResult
from mmcore.errors import ConfigError
from mmcore.testing import make_config, make_runner, plugins_with, train_losses
from mmcore.train.loop import TrainRecipe

ROWS = [[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5], [2.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
SEEN: list[int] = []  # the rows each micro-batch trained on, in order (this process)


def download(ctx, upstream):  # type: ignore[no-untyped-def]
    (ctx.stage_dir / "model").mkdir()
    return StageResult(outputs={"model": "model"})


def recipe(ctx, upstream):  # type: ignore[no-untyped-def]
    import torch

    def build(ctx, upstream):  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        return torch.nn.Linear(4, 1, bias=False)

    def collate(samples):  # type: ignore[no-untyped-def]
        SEEN.extend(ROWS.index(s) for s in samples)
        x = torch.tensor(samples)
        return {"x": x, "y": x.sum(dim=1, keepdim=True), "num_loss_tokens": len(samples)}

    return TrainRecipe(build_model=build, dataset=lambda ctx, up: ROWS, collate=collate, loss=lambda model, batch: ((model(batch["x"]) - batch["y"]) ** 2).sum())


PACK = PackSpec(name="knobs", stages={"download": "test_optimizers:download", "train": Stage("mmcore.train.loop:train_stage", parts={"recipe": "test_optimizers:recipe"})})
COMMON = ["training.lr_schedule=constant", "training.lr=0.05", "training.checkpoint_every=2"]


def train(run: Path, *overrides: str, resume: str = "no"):  # type: ignore[no-untyped-def]
    runner = make_runner(plugins_with(PACK), "knobs", run, overrides=[*COMMON, *overrides])
    runner.run_stage("download")
    return runner.run_stage("train", resume=resume)  # type: ignore[arg-type]


def killed_then_resumed(run: Path, at: str, *overrides: str):  # type: ignore[no-untyped-def]
    """Train in a child process killed (SIGKILL) at crash point ``at``, then resume here."""
    script = "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); from test_optimizers import train; train(Path(sys.argv[2]), *sys.argv[3:])"
    proc = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), str(run), *overrides], env=dict(os.environ, MMCORE_TEST_KILL=at), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    return train(run, *overrides, resume="required")


@pytest.mark.parametrize("knobs", [["training.optimizer=adamw"], ["training.optimizer=sgd", "training.momentum=0.9"], ["training.optimizer=adafactor"]], ids=["adamw", "sgd", "adafactor"])
def test_each_optimizer_trains_and_a_killed_run_resumes_its_state_to_the_same_losses(tmp_path: Path, knobs: list[str]) -> None:
    knobs = ["training.steps=8", "training.micro_batch_size=4", *knobs]  # every step the whole data set: its loss falls step by step
    straight = train(tmp_path / "straight", *knobs)
    losses = list(train_losses(tmp_path / "straight").values())
    assert len(losses) == 8 and all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.9 * losses[0], losses  # it learns
    assert straight.config["training"]["optimizer"] == knobs[2].split("=")[1]
    killed_then_resumed(tmp_path / "killed", "train-step:5", *knobs)  # its last checkpoint: step 4
    assert list(train_losses(tmp_path / "killed").values()) == losses  # the optimizer's state (moments, momentum) came back


def test_adamw_with_its_defaults_spelled_out_is_bit_identical_to_the_default(tmp_path: Path) -> None:
    default = train(tmp_path / "default", "training.steps=4")
    spelled = train(tmp_path / "spelled", "training.steps=4", "training.optimizer=adamw", "training.betas=[0.9,0.999]", "training.eps=1e-8")
    assert train_losses(tmp_path / "spelled") == train_losses(tmp_path / "default")
    assert spelled.plan == default.plan  # the same config: the same run
    saved = [{f.name: f.read_bytes() for f in (run / "train/checkpoints/step-00000004").glob("*.distcp")} for run in (tmp_path / "default", tmp_path / "spelled")]
    assert saved[0] and saved[0] == saved[1]  # model and AdamW state, byte for byte


@pytest.mark.parametrize(
    "override,line",
    [
        (["training.optimizer=lion"], "command line: training.optimizer: Input should be 'adamw', 'sgd' or 'adafactor' (got 'lion')"),
        (["training.optimizer=sgd", "training.betas=[0.8,0.99]"], "command line: training.betas: only training.optimizer adamw uses it; this config's optimizer is sgd"),
        (["training.momentum=0.9"], "command line: training.momentum: only training.optimizer sgd uses it; this config's optimizer is adamw"),
        (["training.betas=[0.9,1.5]"], "command line: training.betas.1: Input should be less than 1 (got 1.5)"),
        (["training.eps=-1"], "command line: training.eps: Input should be greater than 0 (got -1)"),
        (
            ["training.steps=10", "training.epochs=2"],
            "command line: training.steps and training.epochs are both set: give one (steps counts optimizer steps, epochs passes over the data; training.epochs=null to count steps)",
        ),
    ],
    ids=["unknown-optimizer", "betas-with-sgd", "momentum-with-adamw", "beta-out-of-range", "negative-eps", "steps-and-epochs"],
)
def test_a_bad_optimizer_or_length_setting_is_one_line_naming_the_key(override: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_config(plugins_with(PACK), "knobs", overrides=override)
    assert str(info.value) == line


def test_epochs_train_the_steps_the_data_makes_and_every_sample_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    SEEN.clear()
    # 4 samples, 1 per micro-batch, 2 micro-batches a step: 2 steps an epoch, 4 steps in 2 epochs
    manifest = train(tmp_path / "run", "training.epochs=2", "training.grad_accum_steps=2")
    assert manifest.metrics["steps"] == 4 and sorted(SEEN) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert sorted(SEEN[:4]) == [0, 1, 2, 3]  # the first epoch saw each once
    rows = [json.loads(x) for x in (tmp_path / "run/train/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0.5, 1.0, 1.5, 2.0]
    assert "after 4 steps (2 epochs)" in manifest.notes[0]
    assert "training.epochs=2: 4 micro-batch(es) an epoch, 2 a step: 4 steps" in capsys.readouterr().out


def test_epochs_of_packed_rows_are_the_token_budget_samplers_plan() -> None:
    from types import SimpleNamespace

    from mmcore.train.sampler import TokenBudgetSampler, planned_steps

    sampler = TokenBudgetSampler([5, 9, 3, 7, 2, 8, 4, 6, 1, 10], budget=12, seed=0, rank=0, world=1)
    per_epoch = len(sampler.steps(0))  # rows of up to 12 tokens
    steps = planned_steps(SimpleNamespace(epochs=3, steps=100, grad_accum_steps=1), sampler)
    assert steps == 3 * per_epoch
    epochs = [sampler.next_batch()[1] for _ in range(steps)]
    assert epochs == [e for e in range(3) for _ in range(per_epoch)]  # exactly three passes, then the run ends


def test_a_presets_steps_give_way_to_the_users_epochs_and_the_run_reads_back_the_same(tmp_path: Path) -> None:
    from mmcore.config import Layer, RunConfig, build_config, dump_config, overrides_layer, read_yaml

    config = build_config(RunConfig, [Layer("preset 'tiny'", {"training": {"steps": 6}}), overrides_layer(["training.epochs=2"])])
    dump_config(config, tmp_path / "config.yaml")
    again = build_config(RunConfig, [Layer("config.yaml", read_yaml(tmp_path / "config.yaml"))])  # what a rerun continues from
    assert again.slice(("training",)) == config.slice(("training",)) and config.slice(("training",))["training"]["steps"] is None


def test_a_killed_epochs_run_resumes_to_the_straight_runs_losses(tmp_path: Path) -> None:
    train(tmp_path / "straight", "training.epochs=3")  # 12 steps of one sample
    killed_then_resumed(tmp_path / "killed", "train-step:7", "training.epochs=3")  # mid-epoch 2, checkpoint at step 6
    assert train_losses(tmp_path / "killed") == train_losses(tmp_path / "straight") and len(train_losses(tmp_path / "straight")) == 12


def test_adafactor_is_refused_on_megatron_before_any_work() -> None:
    from mmcore.run.preflight import megatron_layout_problem

    config = make_config(plugins_with(PACK), "knobs", overrides=["training.optimizer=adafactor", "parallel.backend=megatron"])
    problem = megatron_layout_problem(config.parallel, config.training, config.world_size)  # what `mmcore train` checks at launch, and the engine again
    assert problem is not None and problem.startswith("training.optimizer: adafactor does not run on parallel.backend: megatron")


def test_adafactor_on_sharded_parameters_is_refused_in_one_line(tmp_path: Path) -> None:
    """torch's Adafactor fails on FSDP2's DTensors (a two-process run: ``aten.pow_`` on a partial
    placement): two processes are refused at launch, a one-process sharded run (bf16) at the stage."""
    from mmcore.errors import MmcoreError
    from mmcore.run.preflight import check_layout

    plugins = plugins_with(PACK)
    config = make_config(plugins, "knobs", overrides=["training.optimizer=adafactor", "parallel.nproc_per_node=2"])
    with pytest.raises(ConfigError, match=r"^training.optimizer: adafactor runs on unsharded parameters only .*: use adamw or sgd"):
        check_layout(plugins, "knobs", config, tmp_path / "run")
    with pytest.raises(MmcoreError) as info:
        train(tmp_path / "bf16", "training.steps=2", "training.optimizer=adafactor", "training.precision=bf16")
    assert info.value.one_line().startswith("training.optimizer: adafactor runs on unsharded parameters only (one process, fp32")


@pytest.mark.compares_runs
def test_gradients_reduced_every_micro_batch_train_as_once_a_step(tmp_path: Path) -> None:
    """parallel.gradient_sync=micro_batch (FSDP2 keeps the gradients sharded and reduce-scatters
    after each micro-batch: what a model whose fp32 gradients do not fit a device needs) trains
    as the default's one reduction a step. bf16, so FSDP2 shards on this one process; 2
    micro-batches a step. Both sum the micro-batches' gradients in fp32 (the default unsharded
    before its one reduction, the other each reduced one), the same additions: rel 1e-6."""
    common = ["training.steps=6", "training.micro_batch_size=2", "training.grad_accum_steps=2", "training.precision=bf16"]
    train(tmp_path / "step", *common)
    train(tmp_path / "each", *common, "parallel.gradient_sync=micro_batch")
    once, each = (list(train_losses(tmp_path / run).values()) for run in ("step", "each"))
    assert len(each) == 6 and each[-1] < 0.9 * each[0], each  # it learns
    assert each == pytest.approx(once, rel=1e-6), (once, each)
