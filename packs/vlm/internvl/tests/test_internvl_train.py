"""Training for real: FSDP2 on 2 processes equals 1, training from the frozen vision cache, the
demo learns and its export answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing import stage_manifest as manifest, two_processes_match_one


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.compares_runs
def test_two_process_fsdp2_matches_one_process(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    two_processes_match_one(mm, tmp_path, ["--pack", "internvl", "--preset", "tiny", "data.demo_samples=24", "convert.verify=false", "evaluate.enabled=false"])


@pytest.mark.slow
def test_a_frozen_vision_tower_trains_from_the_cache(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "internvl", "--preset", "tiny", "data.demo_samples=16", "training.steps=2", "training.freeze=[vision]", "evaluate.enabled=false", "--run-dir", "r")
    extract = manifest(tmp_path / "r", "extract")
    assert extract["status"] == "finished" and extract["metrics"]["unique_media"] == 16, extract
    assert manifest(tmp_path / "r", "train")["status"] == "finished"


@pytest.mark.slow
@pytest.mark.matrix  # the VLM kit's demo path runs in make test for qwen2vl and qwen3vl; tools/demo_matrix.py holds this one's promise
@pytest.mark.compares_runs
def test_demo_learns_and_the_export_answers_the_same(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "internvl", "--preset", "demo")
    run = tmp_path / "runs/internvl-demo"
    train = manifest(run, "train")["metrics"]
    # 4 colours: chance is 0.25. The README's promise, 100%, as tools/demo_matrix.py measured.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] == 1.0, train
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    assert manifest(run, "evaluate")["metrics"]["accuracy"] == 1.0
