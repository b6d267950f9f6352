"""Accelerator plugins, kernel selection and `mmcore doctor`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from mmcore_helpers import CLI
from mmcore.errors import UsageError
from mmcore.framework.plugins import Plugins
from mmcore.framework.registry import KernelSpec, Registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Plugins.load(installed_packs=False).registry


def test_cpu_is_always_there_and_auto_picks_the_best_available(registry: Registry) -> None:
    cpu = registry.accelerator("cpu")
    assert cpu.is_available() and cpu.dist_backend == "gloo"
    assert str(cpu.device(3)) == "cpu"
    best = registry.accelerator("auto")
    available = [a for a in registry.accelerators.values() if a.is_available()]
    assert best.priority == max(a.priority for a in available)
    with pytest.raises(UsageError, match="unknown device 'tpu'; known devices: cpu, cuda, npu, auto"):
        registry.accelerator("tpu")


def test_npu_probe_never_imports_torch_npu_without_cann() -> None:
    code = (
        "import sys\nfrom mmcore.framework.plugins import Plugins\n"
        "npu = Plugins.load(installed_packs=False).registry.accelerators['npu']\n"
        "print(npu.is_available(), 'torch_npu' in sys.modules, npu.why_unavailable)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    available, imported, why = out.split(" ", 2)
    if available == "False":
        assert imported == "False" and why


def test_kernel_falls_back_to_reference_where_the_device_library_is_absent() -> None:
    reg = Registry()
    reg.add_kernel(KernelSpec("rms_norm", "reference", "math:fsum"), "pack:a")
    reg.add_kernel(KernelSpec("rms_norm", "npu", "not_installed_npu_lib:rms", requires=("not_installed_npu_lib",)), "pack:a")
    reg.add_kernel(KernelSpec("rms_norm", "cuda", "math:prod"), "pack:a")
    assert reg.kernel_spec("rms_norm", "npu").device == "reference"
    assert reg.kernel_spec("rms_norm", "cuda").impl == "math:prod"
    assert reg.kernel("rms_norm", "cpu")([1.0, 2.0]) == 3.0
    reg.add_kernel(KernelSpec("rms_norm", "cuda", "math:hypot"), "pack:b")
    assert reg.errors == ["kernel 'rms_norm' for 'cuda' is registered by both pack:a (math:prod) and pack:b (math:hypot)"]
    with pytest.raises(UsageError, match="no reference implementation"):
        reg.kernel_spec("swiglu", "cpu")
    # two packs of one distribution registering the same kernel: one spec, both its providers
    reg.add_kernel(KernelSpec("rms_norm", "cuda", "math:prod"), "pack:a-moe")
    assert reg.kernels[("rms_norm", "cuda")].provider == "pack:a" and reg.kernel_providers[("rms_norm", "cuda")] == {"pack:a", "pack:a-moe"}


def test_info_lists_the_kernel_each_device_gets(cli: CLI) -> None:
    info = json.loads(cli("info", "toy", "--json").stdout)
    assert info["kernels"]["toy_axpb"]["npu"] == "mm_pack_toy.kernels:axpb [reference]"  # no torch_npu here
    assert info["stages"] == ["download", "preprocess", "train", "export"]
    assert info["presets"] == ["tiny"] and info["default_preset"] == "tiny"


def test_doctor_passes_here_and_reports_a_busy_port_with_a_fix(cli: CLI) -> None:
    report = json.loads(cli("doctor", "--pack", "toy", "--json", HF_HUB_OFFLINE="1").stdout)  # tests contact no real host
    assert report["ok"]
    names = {c["name"]: c for c in report["checks"]}
    assert names["torch"]["ok"] and names["device cpu"]["ok"] and names["pack toy requirements"]["ok"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = cli("doctor", "--rdzv-endpoint", f"127.0.0.1:{port}", check=False, HF_HUB_OFFLINE="1")
    assert proc.returncode == 1
    assert f"[FAIL] rendezvous port: 127.0.0.1:{port} is in use" in proc.stdout
    assert "fix: a stale torchrun may hold it" in proc.stdout


def test_doctor_flags_an_unknown_pack(cli: CLI) -> None:
    proc = cli("doctor", "--pack", "nope", check=False, HF_HUB_OFFLINE="1")
    assert proc.returncode == 1 and "[FAIL] pack nope: not installed" in proc.stdout


@pytest.mark.gpu
def test_cuda_accelerator_on_a_gpu(registry: Registry) -> None:
    cuda = registry.accelerators["cuda"]
    if not cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    info = cuda.describe()
    assert info["count"] >= 1 and info["devices"]
    import torch

    cuda.reset_peak_memory()
    torch.ones(1024, 1024, device=cuda.device(0))
    assert cuda.peak_memory_bytes() >= 4 * 1024 * 1024
