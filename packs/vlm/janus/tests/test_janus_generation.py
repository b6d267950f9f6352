"""Janus's second direction, text -> picture, on a tiny model: LLaMA-Factory-style samples whose
assistant turn is a picture train the generation head (its loss falls in a few steps), and the
trained run draws a PNG through transformers' own image generation and the VQ decoder, from
``mmcore infer`` and in the evaluate stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from mmcore.testing import stage_manifest as manifest
from mmcore.testing.media import write_captioned_pictures as write_pictures
from mmcore.testing import train_losses


def test_the_generation_head_learns_and_infer_and_evaluate_draw_pictures(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = write_pictures(tmp_path / "data")
    common = ("--preset", "tiny", f"data.datasets=[{data}]", "training.micro_batch_size=8", "convert.verify=false")
    mm("run", "--pack", "janus", *common, "training.steps=40", "training.lr=0.01", "training.warmup_steps=0", f"evaluate.datasets=[{data}]", "evaluate.limit=2", "--run-dir", "r")
    losses = list(train_losses(tmp_path / "r").values())
    assert losses[0] > 3.5  # ln(64): the tiny codebook's 64 ids, uniform
    # the generation head's cross-entropy falls (measured: 4.16 -> 3.1 by step 40; the random VQ model gives
    # the 8 pictures 128 nearly unique ids, which the tiny decoder memorises slowly)
    assert sum(losses[-5:]) / 5 < 0.85 * losses[0], losses
    evaluate = manifest(tmp_path / "r", "evaluate")["metrics"]
    assert evaluate["pictures"] == 2 and 0.0 <= evaluate["image_token_accuracy"] <= 1.0, evaluate
    drawn = sorted((tmp_path / "r/evaluate/pictures").glob("*.png"))
    assert len(drawn) == 2 and Image.open(drawn[0]).size == (32, 32)
    out = mm("infer", "--run-dir", "r", "--prompt", "a red square", "generation.output=image")
    path = Path(out.stdout.strip().removeprefix("image: "))
    assert path.suffix == ".png" and Image.open(path).size == (32, 32) and Image.open(path).mode == "RGB", out.stdout


@pytest.mark.slow
@pytest.mark.matrix  # two processes: make test-matrix
@pytest.mark.compares_runs
def test_pictures_questions_and_text_mixed_across_two_processes_train_as_one(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Real data mixes text-to-image samples with image questions and text: on two processes
    (micro-batches of 1) the ranks' steps differ in kind -- one runs the generation head, the
    other the vision tower or neither -- yet both train, to the one-process losses (rel 1e-4)."""
    from mmcore.testing.media import write_mixed_mllm

    data = write_mixed_mllm(tmp_path / "data", ("image",))
    write_pictures(tmp_path / "data")
    records = json.loads(data.read_text()) + json.loads((tmp_path / "data/pictures.json").read_text())[:5]
    data.write_text(json.dumps(records))
    common = ("--preset", "tiny", f"data.datasets=[{data}]", "data.demo_samples=0", "training.steps=4", "training.balance_towers=false", "training.eval_every=0", "evaluate.enabled=false")
    mm("run", "--pack", "janus", *common, "training.micro_batch_size=2", "--run-dir", "one")
    mm("run", "--pack", "janus", *common, "training.micro_batch_size=1", "--nproc-per-node", "2", "--run-dir", "two")
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert list(one) == list(two) == [1, 2, 3, 4] and all(abs(two[s] - one[s]) <= 1e-4 * abs(one[s]) for s in one), (one, two)
