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


@pytest.mark.compares_runs
def test_a_step_with_tiles_on_one_process_only_trains_on_two_as_on_one(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Crop mode, two processes, micro-batches of 1: wide images (tiled) and small ones (one
    global view) alternate, so steps hold tiles on one process only. The process without tiles
    runs the DeepEncoder as many times as the other (``DeepseekOcrModel.always_tiles``): without
    it FSDP2's collectives mismatch and gloo aborts ("Received data size doesn't match expected
    size", measured on 12-07). The losses are one process's (fp32, reduction order: rel 1e-5)."""
    import json

    from mmcore.testing.media import write_image

    records = []
    for i in range(8):
        write_image(tmp_path / f"data/{i}.png", [(220, 30, 30), (30, 200, 60), (40, 60, 220)][i % 3], size=(120 if i % 2 == 0 else 48, 48))
        records.append({"messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": ["red", "green", "blue"][i % 3]}], "images": [f"{i}.png"]})
    (tmp_path / "data/data.json").write_text(json.dumps(records))
    # 52-pixel views: the 48 x 48 images stay whole, the 120 x 48 ones are cut into tiles
    common = ["--pack", "deepseek-ocr", "--preset", "tiny", f"data.datasets=[{tmp_path / 'data/data.json'}]", "data.demo_samples=0", "data.eval_fraction=0", "data.image_size=52"]
    common += ["training.steps=4", "training.balance_towers=false", "training.eval_every=0", "evaluate.enabled=false"]
    mm("run", *common, "--run-dir", "one", "training.micro_batch_size=2")
    mm("run", *common, "--run-dir", "two", "training.micro_batch_size=1", "--nproc-per-node", "2")
    # the steps the two processes drew (the loop's sampler for these settings: seed 0, no
    # grouping, no tower balancing): each step puts tiles on one process only
    from mmcore.data import ShardDataset
    from mmcore.train.sampler import EpochSampler

    data = ShardDataset(tmp_path / "two/preprocess/dataset").split("train")
    tiled = ["pixel_values_local" in data.meta(i)["media"] for i in range(len(data))]
    samplers = [EpochSampler(len(data), 0, rank, 2, 1) for rank in range(2)]
    steps = [[tiled[sampler.next_batch()[0][0]] for sampler in samplers] for _ in range(4)]
    assert sum(first != second for first, second in steps) >= 1, steps

    def losses(run: str) -> dict[int, float]:
        rows = [json.loads(line) for line in (tmp_path / run / "train/metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    one, two = losses("one"), losses("two")
    assert manifest(tmp_path / "two", "train")["world_size"] == 2 and len(one) == 4
    assert set(one) == set(two) and all(two[s] == pytest.approx(one[s], rel=1e-5) for s in one), (one, two)
