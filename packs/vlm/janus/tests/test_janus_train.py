"""The demo learns and its export answers (the README's promise); a frozen tower trains from the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing import stage_manifest as manifest


@pytest.mark.slow
@pytest.mark.matrix  # the VLM kit's demo path runs in make test for qwen2vl and qwen3vl; tools/demo_matrix.py holds this one's promise
@pytest.mark.compares_runs
def test_demo_learns_and_the_export_answers_the_same(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "janus", "--preset", "demo")
    run = tmp_path / "runs/janus-demo"
    train = manifest(run, "train")["metrics"]
    # 4 colours: chance is 0.25. The README's promise, 100%, as tools/demo_matrix.py measured.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] == 1.0, train
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(run, "evaluate")["metrics"]  # the export's greedy answers with plain transformers
    assert evaluate["accuracy"] == 1.0, evaluate


@pytest.mark.slow
@pytest.mark.matrix  # the cache's loss equals the pixels' in test_janus_packing; this runs the stage
def test_a_frozen_vision_tower_trains_from_the_cache(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "janus", "--preset", "tiny", "data.demo_samples=8", "training.steps=2", "training.freeze=[vision]", "evaluate.enabled=false", "--run-dir", "r")
    extract = manifest(tmp_path / "r", "extract")
    assert extract["status"] == "finished" and extract["metrics"]["unique_media"] == 8, extract
    assert manifest(tmp_path / "r", "train")["status"] == "finished"


def test_dpo_trains_on_preference_pairs_through_the_kit(tmp_path: Path) -> None:
    """The kit's DPO on the pack's preference demo (which colour is right): the policy starts as its reference."""
    from mmcore.framework.plugins import Plugins
    from mmcore.testing import make_runner

    overrides = [
        "data.demo_samples=8",
        "data.ranking=true",
        "data.eval_fraction=0.25",
        "training.method=dpo",
        "training.steps=2",
        "training.eval_every=2",
        "convert.verify=false",
        "evaluate.enabled=false",
    ]
    make_runner(Plugins.load(), "janus", tmp_path / "r", preset="tiny", overrides=overrides).run_pipeline(resume="no")
    metrics = manifest(tmp_path / "r", "train")["metrics"]
    assert metrics["eval/rewards/margin@0"] == 0.0 and metrics["eval/rewards/accuracy@0"] == 0.5, metrics  # the policy is the reference at step 0
    assert "eval/rewards/margin" in metrics
