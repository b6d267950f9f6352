"""Training for real: FSDP2 (and HSDP) on 2 processes equals 1, bf16 takes one path, recompute
changes nothing, freezing, the demo learns. (Kill -9 and resume, and
qwen2.5vl through every stage, are the conformance suite's: test_qwen2vl_conformance.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY = ["--pack", "qwen2vl", "--preset", "tiny", "data.demo_samples=40", "convert.verify=false"]


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "train/metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}  # a resumed run repeats steps: keep the last


def manifest(run: Path, stage: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / stage / "manifest.json").read_text())


@pytest.mark.slow
@pytest.mark.compares_runs
def test_two_process_fsdp2_matches_one_process(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", *TINY, "--run-dir", "one", "training.steps=3", "training.micro_batch_size=2")
    proc = mm("run", *TINY, "--run-dir", "two", "training.steps=3", "training.micro_batch_size=1", "--nproc-per-node", "2")
    assert manifest(tmp_path / "two", "train")["world_size"] == 2
    # no FSDP2 view warning: the sharded root no longer returns the towers' split embeddings (plugins/fsdp2.py)
    assert "returned a view tensor" not in proc.stderr, proc.stderr
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(one) == list(two) == [1, 2, 3]
    for step in one:  # fp32, same global batch and seed; only the reduction order differs
        assert two[step] == pytest.approx(one[step], rel=1e-5), step
    # The sharded run's final checkpoint exports like any other.
    assert manifest(tmp_path / "two", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    # HSDP (2 replicas of 1 shard) is the same computation with the reduction split differently.
    mm("run", *TINY, "--run-dir", "hsdp", "training.steps=3", "training.micro_batch_size=1", "--nproc-per-node", "2", "parallel.replicate=2")
    hsdp = losses(tmp_path / "hsdp")
    assert list(hsdp) == [1, 2, 3] and all(hsdp[step] == pytest.approx(two[step], rel=1e-5) for step in two), (hsdp, two)
    # Two simulated nodes on loopback, one shared run directory, the same command on each: the
    # whole pipeline, node 0 exporting, the same losses as one node with two processes.
    from mmcore.testing import run_nodes

    nodes = run_nodes(tmp_path, ["run", *TINY, "--run-dir", "nodes", "training.steps=3", "training.micro_batch_size=1"])
    assert [p.returncode for p in nodes] == [0, 0], nodes
    assert losses(tmp_path / "nodes") == two
    assert manifest(tmp_path / "nodes", "export")["metrics"]["logits_max_abs_diff"] == 0.0


@pytest.mark.slow
@pytest.mark.compares_runs
def test_bf16_takes_one_path_on_one_and_two_processes(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """bf16 is FSDP2's mixed-precision policy on one process as on two (not autocast on one):
    fp32 weights and reduction, bf16 compute; the losses agree to bf16's rounding of a reduction
    split differently (rel 1e-3 over 5 steps)."""
    bf16 = ["training.steps=5", "training.precision=bf16", "training.lr=1e-3"]
    mm("run", *TINY, "--run-dir", "one", *bf16, "training.micro_batch_size=2")
    mm("run", *TINY, "--run-dir", "two", *bf16, "training.micro_batch_size=1", "--nproc-per-node", "2")
    for run in ("one", "two"):
        metrics = manifest(tmp_path / run, "train")["metrics"]
        assert metrics["bf16"] and metrics["sharded"], (run, metrics)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(one) == list(two) == [1, 2, 3, 4, 5]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-3), (step, one, two)


@pytest.mark.compares_runs
def test_recompute_changes_no_loss(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Selective recompute of the vision blocks and decoder layers on a packed run: the same
    losses, bit for bit (the same ops on the same inputs), and FLOPs logged beside them."""
    for mode in ("none", "selective"):
        mm("run", *TINY, "--run-dir", mode, "training.steps=2", "training.packing=true", f"training.recompute={mode}")
    assert losses(tmp_path / "selective") == losses(tmp_path / "none")
    assert manifest(tmp_path / "selective", "train")["metrics"]["recompute"] == "selective"
    rows = [json.loads(line) for line in (tmp_path / "selective/train/metrics.jsonl").read_text().splitlines()]
    assert all(r["tflops"] > 0 and "mfu" not in r for r in rows if "loss" in r)  # no peak known for a CPU


def test_frozen_vision_tower_does_not_change(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", *TINY, "--run-dir", "frozen", "training.steps=2", "training.freeze=[vision]")
    assert manifest(tmp_path / "frozen", "train")["metrics"]["frozen_parameters"] > 0
    from safetensors import safe_open

    before = safe_open(str(tmp_path / "frozen/download/model/model.safetensors"), "pt")
    after = safe_open(str(tmp_path / "frozen/export/hf/model.safetensors"), "pt")
    import torch

    vision = [k for k in before.keys() if k.startswith("visual.blocks.")]
    assert vision and all(torch.equal(before.get_tensor(k), after.get_tensor(k)) for k in vision)
    assert not torch.equal(before.get_tensor("lm_head.weight"), after.get_tensor("lm_head.weight"))
    proc = mm("train", *TINY, "--run-dir", "frozen", "training.freeze=[eyes]", check=False)
    assert proc.returncode == 1 and "training.freeze: 'eyes' matches no parameter and is no group (groups: vision, projector, llm)" in proc.stderr


@pytest.mark.slow
@pytest.mark.compares_runs
@pytest.mark.isa_sample
def test_demo_learns_and_the_export_answers_the_same(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm("run", "--pack", "qwen2vl", "--preset", "demo")
    run = tmp_path / "runs/qwen2vl-demo"
    train = manifest(run, "train")["metrics"]
    # 4 colours: chance is 0.25. The README's promise, 100%, is reached by step 48 of 120 with
    # every seed, CPU instruction set and thread count tools/demo_matrix.py tried.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] == 1.0, train
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(run, "evaluate")["metrics"]  # the export's greedy answers, generated in batches
    held_out = manifest(run, "preprocess")["metrics"]["eval_samples"]
    assert evaluate["accuracy"] == evaluate["token_accuracy"] == 1.0 and evaluate["items"] == min(held_out, 256), evaluate
    assert "held-out accuracy" in proc.stdout and (run / "train/train.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.compares_runs
def test_lora_demo_learns_with_the_base_untouched_and_two_processes_match_one(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    proc = mm("run", "--pack", "qwen2vl", "--preset", "lora", "evaluate.enabled=false")
    run = tmp_path / "runs/qwen2vl-lora"
    train = manifest(run, "train")["metrics"]
    # The demo's task by adapters alone (chance 0.25): 0.99-1.0 at step 120 with seeds 0-2 on two
    # instruction sets (tools/demo_matrix.py --preset lora); promised >= 0.9.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] >= 0.9, train
    assert train["lora"]["targets"] == 14 and "LoRA r=16" in proc.stdout  # 2 layers x q k v o gate up down
    export = manifest(run, "export")
    assert export["outputs"] == {"model": "hf", "adapter": "adapter"} and export["metrics"]["logits_max_abs_diff"] == 0.0
    assert export["metrics"]["merged_logits_max_abs_diff"] == 0.0
    # Merged: the base's tensors where no adapter sat are the downloaded ones, bit for bit;
    # every adapted projection moved.
    base = load_file(str(run / "download/model/model.safetensors"))
    merged = load_file(str(run / "export/hf/model.safetensors"))
    assert set(base) == set(merged)
    adapted = {k for k in base if ".layers." in k and k.endswith("_proj.weight") and "visual" not in k}
    assert len(adapted) == 14
    assert all(not torch_equal(base[k], merged[k]) for k in adapted)
    assert all(torch_equal(base[k], merged[k]) for k in set(base) - adapted)

    # FSDP2 over two processes trains the same adapters (they start alike on every rank).
    lora = ["training.steps=3", "training.lora.r=4", "training.lr=1e-2", "evaluate.enabled=false"]
    mm("run", *TINY, "--run-dir", "one", *lora, "training.micro_batch_size=2")
    mm("run", *TINY, "--run-dir", "two", *lora, "training.micro_batch_size=1", "--nproc-per-node", "2")
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(one) == list(two) == [1, 2, 3]
    for step in one:  # fp32, same global batch and seed; only the reduction order differs
        assert two[step] == pytest.approx(one[step], rel=1e-5), step
    assert one[3] < one[1]
    assert manifest(tmp_path / "two", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    # Recompute wraps the blocks with peft's layers inside: the same ops, the same losses bit for bit.
    mm("run", *TINY, "--run-dir", "recompute", *lora, "training.micro_batch_size=2", "training.recompute=full")
    assert losses(tmp_path / "recompute") == one


def torch_equal(a, b) -> bool:  # type: ignore[no-untyped-def]
    import torch

    return bool(torch.equal(a, b))


@pytest.mark.slow
def test_two_fsdp2_ranks_stop_together_at_the_first_nonfinite_step(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Step 1 moves every weight by about lr, so step 2's logits overflow: both ranks stop there
    (none left waiting in a collective), the step-1 checkpoint is kept, no export blames itself."""
    proc = mm("run", *TINY, "--run-dir", "nan", "--nproc-per-node", "2", "training.lr=1e30", "training.steps=4", "training.checkpoint_every=1", "training.eval_every=0", check=False)
    assert proc.returncode == 1, proc.stderr
    kept = tmp_path / "nan/train/checkpoints/step-00000001"
    stopped = [line for line in proc.stderr.splitlines() if "training stopped" in line]
    # both ranks stopped alike, and the launching command says so once
    assert stopped == [
        f"error: training stopped at step 2: the loss is nan; no update was made and the last checkpoint, {kept}, is kept (ranks 0, 1 of 2) "
        "(hint: lower training.lr, or set training.on_nonfinite: skip to skip such steps)"
    ], proc.stderr
    assert sorted(p.name for p in kept.parent.glob("step-*")) == [kept.name] and not (tmp_path / "nan/export").exists()
