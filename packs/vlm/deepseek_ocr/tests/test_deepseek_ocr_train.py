"""The demo learns and its export answers (the README's promise); a short run of its path in the default run."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing import stage_manifest as manifest


@pytest.mark.slow
@pytest.mark.matrix  # the VLM kit's demo path runs in make test for qwen2vl and qwen3vl; tools/demo_matrix.py holds this one's promise
@pytest.mark.compares_runs
def test_demo_learns_and_the_export_answers_the_same(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "deepseek-ocr", "--preset", "demo")
    run = tmp_path / "runs/deepseek-ocr-demo"
    train = manifest(run, "train")["metrics"]
    # 4 colours: chance is 0.25. The README's promise, 100%, as tools/demo_matrix.py measured.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] == 1.0, train
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(run, "evaluate")["metrics"]  # the export's greedy answers (generate() with a KV cache)
    assert evaluate["accuracy"] == 1.0, evaluate


def test_the_demo_path_runs_short(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The demo preset's model and data, a few steps: the export reloads logit for logit and
    answers every held-out question through ``generate()`` (the images only at the prefill)."""
    mm("run", "--pack", "deepseek-ocr", "--preset", "demo", "data.demo_samples=40", "training.steps=3", "training.eval_every=3", "training.checkpoint_every=3", "--run-dir", "r")
    assert manifest(tmp_path / "r", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(tmp_path / "r", "evaluate")["metrics"]
    assert evaluate["items"] == 8 and 0.0 <= evaluate["accuracy"] <= 1.0, evaluate
