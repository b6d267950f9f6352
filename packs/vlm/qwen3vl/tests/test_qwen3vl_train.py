"""Training for real: FSDP2 on 2 processes equals 1 (MoE and dense), training from the frozen
vision cache, the demo learns and its export answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmcore.testing import stage_manifest as manifest, train_losses, two_processes_match_one


def tiny(pack: str, *extra: str) -> list[str]:
    return ["--pack", pack, "data.demo_samples=24", "convert.verify=false", "evaluate.enabled=false", *extra]


@pytest.mark.slow
@pytest.mark.compares_runs
def test_two_process_fsdp2_matches_one_process_with_experts(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Experts are sharded with their decoder layer; the same routing decisions on both runs (a
    flipped top-2 choice would move the loss far beyond rel 1e-5). The router's load-balancing
    loss is computed per micro-batch (one of two samples here, two of one there), as in
    transformers and Megatron, so it is left out of this comparison; the unit test holds its
    value (test_qwen3vl_moe.py).
    Expert parallelism (parallel.expert_parallel=2: each process holds 2 of each layer's 4
    experts, tokens sent to them by all-to-all) runs the same losses; killed with kill -9 after
    step 2, its checkpoint resumes with the experts whole (expert_parallel=1) to the same losses."""
    args = tiny("qwen3vl-moe", "training.moe_aux_loss_coef=0")
    two_processes_match_one(mm, tmp_path, args)
    ep = [*args, "training.steps=3", "training.micro_batch_size=1", "training.checkpoint_every=1", "--nproc-per-node", "2", "--run-dir", "ep"]
    killed = mm("run", *ep, "parallel.expert_parallel=2", check=False, MMCORE_TEST_KILL="train-step:2")
    assert killed.returncode != 0 and "expert parallel: each MoE layer's 4 experts split over groups of 2 processes, 2 on each (2 layers)" in killed.stdout, killed.stdout[-800:]
    resumed = mm("run", *ep)
    assert "[train] resuming (interrupted at step 2" in resumed.stdout, resumed.stdout[-800:]
    two, split = train_losses(tmp_path / "two"), train_losses(tmp_path / "ep")
    assert list(split) == [1, 2, 3]
    for step in two:  # fp32: the all-to-all changes which rank sums an expert's tokens, not the sums (measured equal)
        assert split[step] == pytest.approx(two[step], rel=1e-5), (step, two, split)
    odd = mm("train", *ep, "--force", "parallel.expert_parallel=3", check=False)
    assert odd.returncode == 1 and "error: parallel.expert_parallel=3 does not divide the 2 processes" in odd.stderr, odd.stderr[-800:]


@pytest.mark.slow
@pytest.mark.compares_runs
def test_ulysses_beside_expert_parallel_matches_one_process(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """parallel.ulysses=2 with parallel.expert_parallel=2 on two processes: each rank runs the
    decoder on half of each packed row (with its share of the DeepStack features Qwen3-VL adds
    at the visual tokens), half the vision tower's pictures, and 2 of each layer's 4 experts,
    tokens sent to them by all-to-all. One data replica, so one process with the same
    micro-batch trains the same step: equal losses (fp32; sums in another order, measured rel 1e-7)."""
    args = [*tiny("qwen3vl-moe", "training.moe_aux_loss_coef=0"), "training.packing=true", "training.steps=3", "training.micro_batch_size=2"]
    mm("run", *args, "--run-dir", "one")
    split = mm("run", *args, "--run-dir", "split", "--nproc-per-node", "2", "parallel.ulysses=2", "parallel.expert_parallel=2").stdout
    assert "parallel.ulysses: the 2 ranks of a sequence group split model.visual's frames" in split
    assert "expert parallel: each MoE layer's 4 experts split over groups of 2 processes" in split
    one, both = train_losses(tmp_path / "one"), train_losses(tmp_path / "split")
    assert list(both) == [1, 2, 3]
    for step in one:
        assert both[step] == pytest.approx(one[step], rel=1e-5), (step, one, both)


@pytest.mark.slow
@pytest.mark.matrix  # four processes: make test-matrix
@pytest.mark.compares_runs
def test_expert_parallel_inside_hsdp_matches_plain_fsdp(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Four processes as two HSDP replicas (parallel.replicate=2) with the experts split over
    pairs (parallel.expert_parallel=2, the experts sharded over their copies in both replicas):
    the losses of plain FSDP over the four (fp32; measured equal)."""
    args = [*tiny("qwen3vl-moe", "training.moe_aux_loss_coef=0"), "training.steps=3", "training.micro_batch_size=1", "--nproc-per-node", "4"]
    mm("run", *args, "--run-dir", "plain")
    assert "expert parallel: each MoE layer's 4 experts split" in mm("run", *args, "--run-dir", "hsdp", "parallel.replicate=2", "parallel.expert_parallel=2").stdout
    plain, hsdp = train_losses(tmp_path / "plain"), train_losses(tmp_path / "hsdp")
    assert list(hsdp) == [1, 2, 3]
    for step in plain:
        assert hsdp[step] == pytest.approx(plain[step], rel=1e-5), (step, plain, hsdp)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.compares_runs
def test_two_process_fsdp2_matches_one_process(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    two_processes_match_one(mm, tmp_path, tiny("qwen3vl"))


@pytest.mark.slow
def test_a_frozen_vision_tower_trains_from_the_cache(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm("run", "--pack", "qwen3vl", "--preset", "tiny", "data.demo_samples=16", "training.steps=2", "training.freeze=[vision]", "evaluate.enabled=false", "--run-dir", "r")
    extract = manifest(tmp_path / "r", "extract")
    assert extract["status"] == "finished" and extract["metrics"]["unique_media"] == 16, extract
    assert "DeepStack" in proc.stdout and manifest(tmp_path / "r", "train")["status"] == "finished"


@pytest.mark.slow
@pytest.mark.compares_runs
def test_demo_learns_and_the_export_answers_the_same(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm("run", "--pack", "qwen3vl", "--preset", "demo")
    run = tmp_path / "runs/qwen3vl-demo"
    train = manifest(run, "train")["metrics"]
    # 4 colours: chance is 0.25. The README's promise, 100%, as tools/demo_matrix.py measured.
    assert train["eval/accuracy@0"] <= 0.5 and train["eval/accuracy"] == 1.0, train
    assert manifest(run, "export")["metrics"]["logits_max_abs_diff"] == 0.0
    evaluate = manifest(run, "evaluate")["metrics"]  # the export's greedy answers with plain transformers
    assert evaluate["accuracy"] == 1.0, evaluate
