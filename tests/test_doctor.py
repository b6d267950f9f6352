"""`mmcore doctor` on a first-hour machine: quiet about accelerators it does not have, and a hub
check that says offline mode (and who set it) or an unreachable hub in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mmcore_helpers import CLI


def test_doctor_on_a_machine_without_accelerators_says_nothing_of_cuda_or_cann(cli: CLI) -> None:
    from mmcore.cli.doctor import hardware_sign

    if hardware_sign("cuda") or hardware_sign("npu"):
        pytest.skip("this machine has accelerator hardware")
    proc = cli("doctor", HF_HUB_OFFLINE="1")
    assert "[PASS] device cpu" in proc.stdout
    assert not [line for line in proc.stdout.lower().splitlines() if "cuda" in line or "cann" in line or "npu" in line], proc.stdout
    names = [c["name"] for c in json.loads(cli("doctor", "--json", HF_HUB_OFFLINE="1").stdout)["checks"]]
    assert "device cuda" not in names and "device npu" not in names
    # asked for by name, a missing device is still a failure with its fix
    proc = cli("doctor", "--device", "cuda", check=False, HF_HUB_OFFLINE="1")
    assert proc.returncode == 1 and "[FAIL] device cuda: not present" in proc.stdout and "fix: install the NVIDIA driver" in proc.stdout


def test_doctor_warns_of_the_missing_pieces_of_an_accelerator_whose_driver_is_there(cli: CLI, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA works here")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (tools / "nvidia-smi").chmod(0o755)
    proc = cli("doctor", HF_HUB_OFFLINE="1", PATH=f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert "[WARN] device cuda: not present (the hardware is there: nvidia-smi on PATH)" in proc.stdout, proc.stdout
    assert "fix: install the NVIDIA driver and a CUDA build of torch" in proc.stdout
    assert "device npu" not in proc.stdout


def test_doctor_says_an_unreachable_hub_in_one_line_and_offline_mode_with_who_set_it(cli: CLI) -> None:
    from mmcore.run.launch import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there: refused at once
    proc = cli("doctor", HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0")
    assert proc.returncode == 0  # a warning: local models still work
    lines = [line for line in proc.stdout.splitlines() if "hub" in line and "fix:" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"[WARN] hub: {endpoint} unreachable within 3 s (ConnectError: "), proc.stdout
    assert "fix: check the network or proxy (HTTPS_PROXY, HF_ENDPOINT)" in proc.stdout
    proc = cli("doctor", HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="1")
    assert "[PASS] hub: offline mode set by HF_HUB_OFFLINE=1: not contacted" in proc.stdout
    proc = cli("doctor", "--offline", HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0")
    assert "[PASS] hub: offline mode set by --offline (run.offline): not contacted" in proc.stdout
