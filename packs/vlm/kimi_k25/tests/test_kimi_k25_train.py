"""The demo learns and its export answers (the README's promise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing import stage_manifest as manifest


@pytest.mark.slow
@pytest.mark.matrix  # the VLM kit's demo path runs in make test for qwen2vl and qwen3vl; tools/demo_matrix.py holds this one's promise
@pytest.mark.compares_runs
def test_demo_learns_and_the_export_answers_the_same(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "kimi-k2.5", "--preset", "demo")
    run = tmp_path / "runs/kimi-k2.5-demo"
    train = manifest(run, "train")["metrics"]
    # 4 colours: chance is 0.25. The README's promise, 100%, as tools/demo_matrix.py measured.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] == 1.0, train
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(run, "evaluate")["metrics"]  # the export's greedy answers with plain transformers
    assert evaluate["accuracy"] == 1.0, evaluate


@pytest.mark.slow
def test_a_frozen_vision_tower_trains_from_the_cache(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "kimi-k2.5", "--preset", "tiny", "data.demo_samples=8", "training.steps=2", "training.freeze=[vision]", "evaluate.enabled=false", "--run-dir", "r")
    extract = manifest(tmp_path / "r", "extract")
    assert extract["status"] == "finished" and extract["metrics"]["unique_media"] == 8, extract
    assert manifest(tmp_path / "r", "train")["status"] == "finished"


@pytest.mark.slow
@pytest.mark.matrix  # the kit's DPO path runs in make test for qwen2vl; this pack's pairs run in make test-matrix
def test_dpo_on_the_preference_demo_starts_from_its_reference_and_trains(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """DPO through the kit on the pack's synthetic preference pairs (image questions, a right and
    a wrong colour): at step 0 the policy is the reference (margin 0, accuracy 0.5), and it trains."""
    import json

    mm(
        "run",
        "--pack",
        "kimi-k2.5",
        "--preset",
        "tiny",
        "data.demo_samples=12",
        "data.ranking=true",
        "training.method=dpo",
        "training.steps=3",
        "training.eval_every=3",
        "evaluate.enabled=false",
        "--run-dir",
        "r",
    )
    train = manifest(tmp_path / "r", "train")
    assert train["status"] == "finished", train
    assert train["metrics"]["eval/rewards/margin@0"] == 0.0 and train["metrics"]["eval/rewards/accuracy@0"] == 0.5, train["metrics"]
    rows = [json.loads(x) for x in (tmp_path / "r/train/metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "loss" in r]) == 3
