"""Loss terms normalised apart (``TrainRecipe.loss_terms``, ``loss_of_terms``): a step's loss
is the sum of each term's mean over the whole step, however its samples are cut into
micro-batches, as references that add means of unlike units train (BAGEL: token-mean CE plus
latent-token-mean MSE). The FSDP2 train engine on a four-weight linear model, in-process; two
processes are the bagel pack's mixed-kinds test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore import PackSpec, Stage, StageResult
from mmcore.testing import make_runner, plugins_with
from mmcore.train import loss_of_terms
from mmcore.train.loop import TrainRecipe

# (kind, inputs, target): kind "a" weighs one unit, kind "b" three (a sample of three equal tokens)
ROWS = [("a", [1.0, 2.0, 3.0, 4.0], 1.0), ("b", [0.5, 0.5, 0.5, 0.5], 2.0), ("a", [2.0, 1.0, 0.0, 1.0], -1.0), ("b", [1.0, 1.0, 1.0, 1.0], 0.5)]
UNITS = {"a": 1, "b": 3}


def download(ctx, upstream):  # type: ignore[no-untyped-def]
    (ctx.stage_dir / "model").mkdir()
    return StageResult(outputs={"model": "model"})


def build(ctx, upstream):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(4, 1, bias=False)


def recipe(ctx, upstream):  # type: ignore[no-untyped-def]
    import torch

    def collate(samples):  # type: ignore[no-untyped-def]
        counts = {k: sum(UNITS[k] for kind, _, _ in samples if kind == k) for k in UNITS}
        return {
            "x": torch.tensor([x for _, x, _ in samples]),
            "y": torch.tensor([[y] for _, _, y in samples]),
            "units": torch.tensor([[float(UNITS[kind])] for kind, _, _ in samples]),
            "is_a": torch.tensor([[kind == "a"] for kind, _, _ in samples]),
            "loss_counts": counts,
            "num_loss_tokens": sum(counts.values()),
        }

    def loss(model, batch):  # type: ignore[no-untyped-def]
        err = batch["units"] * (model(batch["x"]) - batch["y"]) ** 2  # each of a sample's units the same error
        return loss_of_terms(batch, {"a": (err * batch["is_a"]).sum(), "b": (err * ~batch["is_a"]).sum()})

    return TrainRecipe(build_model=build, dataset=lambda ctx, up: ROWS, collate=collate, loss=loss, loss_terms=("a", "b"))


PACK = PackSpec(name="terms", stages={"download": "test_loss_terms:download", "train": Stage("mmcore.train.loop:train_stage", parts={"recipe": "test_loss_terms:recipe"})})


def first_loss(run: Path, micro: int, accum: int) -> float:
    runner = make_runner(plugins_with(PACK), "terms", run, overrides=["training.steps=1", f"training.micro_batch_size={micro}", f"training.grad_accum_steps={accum}", "training.checkpoint_every=0"])
    runner.run_stage("download")
    runner.run_stage("train")
    return json.loads((run / "train/metrics.jsonl").read_text().splitlines()[0])["loss"]


@pytest.mark.parametrize(("micro", "accum"), [(4, 1), (2, 2), (1, 4)])
def test_the_step_loss_is_each_terms_mean_summed_however_the_step_is_cut(tmp_path: Path, micro: int, accum: int) -> None:
    import torch

    weight = build(None, None).weight.detach()[0]
    errors = {"a": [], "b": []}
    for kind, x, y in ROWS:
        errors[kind].append(float((weight @ torch.tensor(x) - y) ** 2))
    means = sum(sum(e) / len(e) for e in errors.values())  # a "b" sample's three units share one error
    pooled = (sum(errors["a"]) + 3 * sum(errors["b"])) / (len(errors["a"]) + 3 * len(errors["b"]))
    assert abs(means - pooled) > 0.1 * means  # the two reductions differ on this data
    assert first_loss(tmp_path / "run", micro, accum) == pytest.approx(means, rel=1e-6)


def test_a_term_no_sample_of_the_step_has_adds_its_empty_sum() -> None:
    import torch

    batch = {"global_loss_counts": {"all": 4.0, "a": 4.0, "b": 0.0}}
    assert float(loss_of_terms(batch, {"a": torch.tensor(8.0), "b": torch.zeros(())})) == 8.0
