"""Diffusion-DPO on Wan: the dpo demo comes to prefer red squares, pairs are checked, the LoRA
export loads in diffusers. (The loss against the paper's formula is tests/test_preference.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcore.data import write_mp4


def manifest(run: Path, stage: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / stage / "manifest.json").read_text())


@pytest.mark.slow
@pytest.mark.compares_runs
def test_dpo_demo_comes_to_prefer_red_squares(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = wan("run", "--pack", "wan", "--preset", "dpo", "evaluate.enabled=false")
    run = tmp_path / "runs/wan-dpo"
    train = manifest(run, "train")["metrics"]
    # Held-out pairs at fixed noise: a tie (0.5) before training; at step 60, 0.875-0.94 over
    # seeds 0-2 here (16 held-out pairs, 1/16 each); promised >= 0.75.
    assert train["eval/implicit_accuracy@0"] == 0.5 and train["eval/implicit_accuracy"] >= 0.75, train
    assert "80 pairs" in proc.stdout and train["lora"]["r"] == 16
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    assert all("implicit_accuracy" in r and "pairs_per_s" in r for r in rows if "loss" in r)
    export = manifest(run, "export")
    assert export["outputs"] == {"model": "lora", "adapter": "lora"} and export["metrics"]["max_abs_diff"] <= 1e-4


def test_pairs_need_one_bucket_and_lora(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "pairs"
    frames = np.full((9, 32, 32, 3), 255, dtype=np.uint8)
    write_mp4(root / "a.mp4", frames, 8)
    write_mp4(root / "b.mp4", np.full((9, 32, 48, 3), 128, dtype=np.uint8), 8)
    write_mp4(root / "c.mp4", frames // 2, 8)
    (root / "pairs.json").write_text(json.dumps([{"cap": "x", "chosen": "a.mp4", "rejected": "b.mp4"}, {"cap": "y", "chosen": "a.mp4", "rejected": "c.mp4"}]))
    args = [
        "run",
        "--pack",
        "wan",
        "--preset",
        "tiny",
        "--data",
        str(root / "pairs.json"),
        "data.ranking=true",
        "data.demo_samples=0",
        "data.on_bad_sample=skip",
        "data.buckets=[[32,32,5],[32,48,5]]",
        "training.method=dpo",
        "training.steps=1",
        "training.micro_batch_size=1",
    ]
    proc = wan(*args, check=False)
    assert proc.returncode != 0 and "Diffusion-DPO's reference is the base with the LoRA adapters off" in proc.stderr
    bad = [json.loads(line) for line in (tmp_path / "runs/wan-tiny/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert len(bad) == 1 and "chosen and rejected fall in different buckets (32x32x5 and 32x48x5)" in bad[0]["reason"]
    wan(*args, "training.lora.r=4")
    assert manifest(tmp_path / "runs/wan-tiny", "train")["metrics"]["steps"] == 1
