"""training.ema: the moving average of the weights is kept in every checkpoint, survives a kill
bit for bit, and is what export writes (export.weights: last writes the last step's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

EMA_RUN = ["--pack", "wan", "--preset", "tiny", "data.demo_samples=8", "training.steps=4", "training.checkpoint_every=1", "training.ema=0.9", "training.lr=0.01", "evaluate.enabled=false"]
EXPORTED = "export/pipeline/transformer/diffusion_pytorch_model.safetensors"


def tensors(checkpoint: Path, prefix: str) -> dict:  # type: ignore[type-arg]
    from mmcore.engines import dcp_index, load_dcp_tensors

    index = dcp_index(checkpoint, prefix)
    return load_dcp_tensors(checkpoint, index, index, prefix)


@pytest.mark.compares_runs
def test_ema_is_exported_and_a_killed_run_resumes_to_the_same_bits(wan, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from safetensors.torch import load_file

    from mmcore.train import decay_at

    wan("run", *EMA_RUN, "--run-dir", "straight")
    run = tmp_path / "straight"
    # The average after step 4 is step 3's folded with step 4's weights, at diffusers' warm-up decay.
    step3, step4 = sorted((run / "train/checkpoints").glob("step-*"))
    before, weights, after = tensors(step3, "ema."), tensors(step4, "model."), tensors(step4, "ema.")
    assert set(after) == set(weights)  # every weight trains here
    for name in after:
        assert torch.equal(after[name], before[name].lerp(weights[name], 1 - decay_at(0.9, 3))), name
    assert any(not torch.equal(after[n], weights[n]) for n in after)

    # Export writes the average (the train stage's `ema` checkpoint), bit for bit.
    exported = load_file(run / EXPORTED)
    assert set(exported) == set(after) and all(torch.equal(exported[n], after[n]) for n in after)
    assert json.loads((run / "train/manifest.json").read_text())["outputs"]["ema"] == "checkpoints/ema"

    # kill -9 after step 2, resume: the same average, so the same exported bytes.
    shutil.copytree(run, tmp_path / "killed", symlinks=True, ignore=lambda folder, names: [n for n in names if folder == str(run) and n in ("train", "export")])
    proc = wan("run", *EMA_RUN, "--run-dir", "killed", check=False, MMCORE_TEST_KILL="train-step:2")
    assert proc.returncode != 0 and not (tmp_path / "killed/train/manifest.json").exists()
    wan("run", *EMA_RUN, "--run-dir", "killed")
    assert (tmp_path / "killed" / EXPORTED).read_bytes() == (run / EXPORTED).read_bytes()

    # export.weights=last: the last step's weights instead.
    wan("export", *EMA_RUN, "export.weights=last", "--run-dir", "straight")
    last = load_file(run / EXPORTED)
    assert all(torch.equal(last[n], weights[n]) for n in weights)
