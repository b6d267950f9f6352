"""``mmcore plan`` on the clusters issue 46 names, offline, from hand-written public configs
(tests/fixtures/plan, built on meta: no weights, no network): Qwen2.5-VL-72B on 64 Ascend 910B
and Wan2.1-14B at 81 x 720p on 8 H100 each print a fitting layout, named in the table. (How
close its figures come to a real step is tests/test_plan_measured.py.)"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("diffusers")

FIXTURES = Path(__file__).parent / "fixtures" / "plan"
SCALE_OUT = Path(__file__).parents[1] / "docs" / "scale-out.md"


def plan(*args: str) -> str:
    from click.testing import CliRunner

    from mmcore.cli import cli

    result = CliRunner().invoke(cli, ["plan", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def fitting_row(output: str) -> tuple[str, list[str]]:
    best = re.search(r"^best fitting layout: (.+?) \(", output, re.M)
    assert best, output
    rows = [line for line in output.splitlines() if line.startswith(best.group(1) + " ")]
    assert rows, f"{best.group(1)!r} is not in the table:\n{output}"
    line = next(line for line in output.splitlines() if line.startswith("best fitting layout: "))
    assert line in SCALE_OUT.read_text(), f"docs/scale-out.md shows another plan than mmcore plan prints now: {line}"
    return best.group(1), rows[0].split()


def test_qwen2_5_vl_72b_fits_64_ascend_910b() -> None:
    out = plan("--pack", "qwen2.5vl", "--model", str(FIXTURES / "qwen2_5_vl_72b"), "--seq", "8192", "--device", "910b", "--nodes", "8", "--gpus-per-node", "8")
    assert "73.41B parameters" in out  # Qwen2.5-VL-72B: 72B decoder + 0.67B vision tower
    assert "8 x 8 Ascend 910B 64GB (64.0 GiB, 313 TFLOP/s bf16 peak)" in out
    name, row = fitting_row(out)
    assert "yes" in row and float(row[len(name.split()) + 6]) <= 64.0  # its total fits the device


def test_wan2_1_14b_720p_fits_8_h100() -> None:
    out = plan("--pack", "wan", "--model", str(FIXTURES / "wan2_1_t2v_14b"), "--frames", "81", "--height", "720", "--width", "1280", "--device", "h100", "--gpus-per-node", "8")
    assert "14.29B parameters" in out
    assert "latents 21x90x160 (VAE 4x8x8) -> 75600 tokens" in out  # an 81-frame 720p clip is ~75k tokens (issue 46)
    name, row = fitting_row(out)
    assert "recompute" in name  # 75k tokens do not fit without it
    assert "yes" in row


def test_layouts_not_yet_in_mmcore_are_marked() -> None:
    out = plan("--pack", "wan", "--model", str(FIXTURES / "wan2_1_t2v_14b"), "--frames", "81", "--height", "720", "--width", "1280", "--top", "40")
    assert "sp2 recompute" in out and "Ulysses" not in out  # diffusers' context-parallel plan for Wan: runnable
    assert "not yet runnable in mmcore (this pack has no megatron part" in out


def test_device_peaks_are_the_accelerator_table() -> None:
    from mmcore.framework.accelerator import peak_of
    from mmcore.plan.devices import DEVICES, device_of

    assert DEVICES["910b"].peak == peak_of("Ascend910B3") == 313e12
    assert DEVICES["h100"].peak == peak_of("NVIDIA H100 80GB HBM3") == 989e12
    assert device_of("Ascend-910B") is DEVICES["910b"] and device_of("H200") is DEVICES["h200"] and device_of("a100") is DEVICES["a100"]


def test_an_moe_model_gets_expert_parallel_layouts() -> None:
    """Qwen3-VL-30B-A3B (128 experts, 8 per token): FSDP with expert parallel 2, 4 and 8 holds
    the same model state per rank as plain FSDP over the 8 processes, gathers 1/ep of a block's
    experts (smaller buffers), and pays the tokens' all-to-alls in the step time."""
    out = plan("--pack", "qwen3vl-moe", "--model", str(FIXTURES / "qwen3_vl_30b_a3b"), "--seq", "8192", "--gpus-per-node", "8", "--top", "60")
    assert "31.07B parameters" in out
    rows = {}
    for line in out.splitlines():
        words = line.split()
        at = next((i for i, w in enumerate(words) if re.fullmatch(r"[0-9.]+", w)), 0)
        rows[" ".join(words[:at])] = words[at:]
    plain, ep = rows["fsdp8 recompute"], [rows[f"fsdp8 ep{n} recompute"] for n in (2, 4, 8)]
    assert all(row[:3] == plain[:3] for row in ep)  # weights, gradients, optimizer state
    buffers = [float(row[5]) for row in ep]
    assert float(plain[5]) > buffers[0] > buffers[1] > buffers[2], (plain, ep)
    assert all(float(row[8]) > float(plain[8]) for row in ep)  # step seconds: the all-to-alls


def test_accumulation_and_the_network_decide_between_fsdp_and_hsdp() -> None:
    """Qwen2.5-VL-72B on 64 910B, 64 rows a step, micro-batches of 1: at sp8 each rank runs 8
    micro-batches. FSDP2's default keeps their unsharded fp32 gradients (294 GB) until the step's
    reduction, which no 64 GiB device holds, so the plan gives that layout
    ``parallel.gradient_sync: micro_batch`` (sync-mb): then every micro-batch's reduce-scatter
    crosses the 25 GB/s network, and sharding inside the node (HSDP) is faster."""
    from mmcore.plan.devices import DEVICES
    from mmcore.plan.layouts import Layout, estimate
    from mmcore.plan.model import planned

    plan_ = planned("qwen2.5vl", str(FIXTURES / "qwen2_5_vl_72b"), seq=8192)
    device = DEVICES["910b"]
    fsdp = estimate(plan_, Layout(shard=8, sp=8), device, micro_batch=1, global_batch=64, per_node=8)
    assert fsdp.layout.sync_every and fsdp.layout.name() == "fsdp64 sp8 sync-mb"
    one_row = estimate(plan_, Layout(shard=8, sp=8), device, micro_batch=1, global_batch=8, per_node=8)
    assert not one_row.layout.sync_every  # one micro-batch a step: nothing accumulates unsharded
    hsdp = estimate(plan_, Layout(shard=1, replicate=8, sp=8, offload=True), device, micro_batch=1, global_batch=64, per_node=8)
    assert hsdp.fits and hsdp.step_s < fsdp.step_s, (hsdp.step_s, fsdp.step_s)
    # the same layouts on one node's links (a cluster whose network were as fast as NVLink/HCCS) cost the compute alone
    fast = dataclasses.replace(device, node_link=device.peer_link)
    assert estimate(plan_, Layout(shard=8, sp=8), fast, micro_batch=1, global_batch=64, per_node=8).step_s < fsdp.step_s
