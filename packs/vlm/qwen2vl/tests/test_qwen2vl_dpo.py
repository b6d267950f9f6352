"""DPO on Qwen2-VL: LLaMA-Factory's ranking files preprocessed as written, the DPO demo learns to
prefer the right colour, packed pairs train like padded ones. (The loss against a direct
implementation is tests/test_preference.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.testing.media import write_image


def manifest(run: Path, stage: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / stage / "manifest.json").read_text())


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.slow
@pytest.mark.compares_runs
def test_dpo_demo_comes_to_prefer_the_right_colour(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm("run", "--pack", "qwen2vl", "--preset", "dpo", "evaluate.enabled=false")
    run = tmp_path / "runs/qwen2vl-dpo"
    train = manifest(run, "train")["metrics"]
    # Before training the policy is the reference: every reward 0, a tie, counted half right.
    # >= 90% by step 48 of 80 and after with every seed (0-2), CPU instruction set and thread
    # count tools/demo_matrix.py tried (reached at steps 20-36; final 0.99-1.0).
    assert train["eval/rewards/accuracy@0"] == 0.5 and train["eval/rewards/accuracy"] >= 0.9, train
    assert train["eval/rewards/margin"] > 0 and train["lora"]["r"] == 16
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    assert all("rewards/accuracy" in r and "pairs_per_s" in r for r in rows if "loss" in r)
    assert "held-out rewards/accuracy: 0.5 at step 0" in proc.stdout
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0


@pytest.mark.compares_runs
def test_llama_factory_ranking_files_preprocess_and_packed_pairs_train_like_padded(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    for name, colour in (("red.png", (220, 30, 30)), ("blue.png", (40, 60, 220))):
        write_image(data / "images" / name, colour)
    sharegpt = [  # LLaMA-Factory's mllm_dpo_demo shape: ShareGPT with the answers as messages
        {
            "conversations": [{"from": "human", "value": "<image>What colour is it?"}],
            "chosen": {"from": "gpt", "value": "It is red."},
            "rejected": {"from": "gpt", "value": "It is blue."},
            "images": ["images/red.png"],
        },
        {
            "conversations": [{"from": "human", "value": "<image>What colour is it?"}],
            "chosen": {"from": "gpt", "value": "It is blue."},
            "rejected": {"from": "gpt", "value": "It is red."},
            "images": ["images/blue.png"],
        },
        {
            "conversations": [{"from": "human", "value": "<image>What colour is it?"}],
            "chosen": {"from": "gpt", "value": "red"},
            "rejected": {"from": "gpt", "value": "red"},
            "images": ["images/red.png"],
        },  # bad: the same answer
    ] * 3
    alpaca = [
        {"instruction": "Name a colour", "input": "", "chosen": "red", "rejected": "a shape"},
        {"instruction": "Name a shape", "input": "one with corners", "chosen": "a square", "rejected": "blue"},
    ] * 3
    (data / "dpo_mllm.json").write_text(json.dumps(sharegpt))
    (data / "dpo_text.json").write_text(json.dumps(alpaca))
    common = [
        "--pack",
        "qwen2vl",
        "--preset",
        "tiny",
        "--data",
        str(data / "dpo_mllm.json"),
        "--data",
        str(data / "dpo_text.json"),
        "data.ranking=true",
        "data.on_bad_sample=skip",
        "data.demo_samples=0",
        "training.method=dpo",
        "training.steps=2",
        "training.micro_batch_size=4",
        "training.lr=1e-3",
        "convert.verify=false",
    ]
    mm("run", *common, "--run-dir", "padded", f"evaluate.datasets=[{data / 'dpo_mllm.json'}]")
    pre = manifest(tmp_path / "padded", "preprocess")["metrics"]
    assert pre["train_samples"] == 12 and pre["skipped"] == 3, pre
    bad = [json.loads(line) for line in (tmp_path / "padded/preprocess/bad_samples.jsonl").read_text().splitlines()]
    assert bad[0]["reason"] == "chosen and rejected are the same answer" and bad[0]["file"].endswith("dpo_mllm.json")
    train = manifest(tmp_path / "padded", "train")["metrics"]
    assert "lora" not in train and (tmp_path / "padded/train/reference_logps.safetensors").is_file()  # full fine-tuning: precomputed reference
    # evaluate scores the export's answers against each held-out pair's chosen answer, in the user's words
    results = [json.loads(line) for line in (tmp_path / "padded/evaluate/results.jsonl").read_text().splitlines()]
    assert [r["reference"] for r in results] == ["It is red.", "It is blue."] * 3, results  # the pair with equal answers: a counted bad sample
    assert all(r["prompt"] == "What colour is it?" and r["media"] for r in results), results
    mm("run", *common, "--run-dir", "packed", "training.packing=true", "evaluate.enabled=false")
    padded, packed = losses(tmp_path / "padded"), losses(tmp_path / "packed")
    # the same pairs in one packed row instead of padded rows: the same sums to fp32 rounding
    assert list(padded) == list(packed) == [1, 2]
    for step in padded:
        assert packed[step] == pytest.approx(padded[step], rel=1e-4), (padded, packed)
