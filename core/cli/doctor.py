"""``mmcore doctor``: pre-flight checks, each with pass/fail and how to fix it."""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import shutil
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from mmcore import __version__
from mmcore.framework.plugins import Plugins
from mmcore.framework.versions import unmet_requirements

DEFAULT_RDZV_PORT = 29500


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    hint: str = ""
    required: bool = True  # a failed optional check is a warning, not a failure

    def as_dict(self) -> dict:
        return asdict(self)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


#: What shows that a machine has an accelerator's hardware (device files, the driver's tool),
#: whatever torch makes of it: only then is a missing piece (CUDA build, CANN, torch_npu) worth a
#: warning. A CPU machine is told nothing about CUDA or Ascend.
HARDWARE_SIGNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cuda": (("/dev/nvidia[0-9]*", "/dev/kfd"), ("nvidia-smi", "rocm-smi")),
    "npu": (("/dev/davinci[0-9]*",), ("npu-smi",)),
}


def hardware_sign(name: str) -> str | None:
    """What shows accelerator ``name``'s hardware here (a device file, the driver's tool on
    PATH), or None; an accelerator without known signs counts as present (a plugin's own)."""
    if name not in HARDWARE_SIGNS:
        return name
    files, tools = HARDWARE_SIGNS[name]
    for pattern in files:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    for tool in tools:
        if shutil.which(tool):
            return f"{tool} on PATH"
    return None


#: Longest wait for the hub's answer: doctor is a quick look, not a download.
HUB_TIMEOUT_S = 3.0


def hub_check(*, offline: bool = False, timeout: float = HUB_TIMEOUT_S) -> Check:
    """Whether the hub (HF_ENDPOINT, else huggingface.co) answers, through huggingface_hub's
    own session (its proxy settings and headers); any HTTP answer counts. Offline mode is
    said, not tried."""
    from mmcore.engines.download import hub_endpoint

    flag = os.environ.get("HF_HUB_OFFLINE", "")
    if offline or flag.strip().lower() in ("1", "true", "yes", "on"):
        who = "--offline (run.offline)" if offline else f"HF_HUB_OFFLINE={flag}"
        return Check("hub", True, f"offline mode set by {who}: not contacted; models come from local folders and the hub cache")
    endpoint = hub_endpoint()
    try:
        from huggingface_hub.utils import get_session

        response = get_session().head(endpoint, timeout=timeout, follow_redirects=False)
    except Exception as exc:  # what the network said, in one line: refused, timed out, no such host, proxy
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        return Check(
            "hub",
            False,
            f"{endpoint} unreachable within {timeout:g} s ({reason})",
            "check the network or proxy (HTTPS_PROXY, HF_ENDPOINT), or work offline: --offline with local model folders",
            required=False,
        )
    return Check("hub", True, f"{endpoint} answers (HTTP {response.status_code})")


def run_checks(
    plugins: Plugins, *, pack: str | None = None, device: str = "auto", rdzv_endpoint: str | None = None, runs_root: str = "runs", min_free_gb: float = 5.0, offline: bool = False, hub: bool = True
) -> list[Check]:
    checks: list[Check] = []
    py_ok = sys.version_info >= (3, 10)
    checks.append(Check("python", py_ok, f"{platform.python_version()} ({sys.executable})", "use Python 3.10 or newer"))
    checks.append(Check("mmcore", True, __version__))

    try:
        import torch

        checks.append(Check("torch", True, f"{torch.__version__}"))
    except Exception as exc:  # a broken torch_npu install makes `import torch` itself fail
        hint = "pip install torch"
        if importlib.util.find_spec("torch_npu") is not None:
            hint = "torch_npu is installed without CANN, which breaks `import torch`: source CANN's set_env.sh or `pip uninstall torch-npu`"
        checks.append(Check("torch", False, f"import failed: {exc}", hint))
        return checks

    registry = plugins.registry
    for problem in registry.errors:
        checks.append(Check("plugin registration", False, problem, "uninstall one of the clashing plugins", required=False))
    for name, acc in sorted(registry.accelerators.items(), key=lambda kv: -kv[1].priority):
        info = acc.describe()
        available = bool(info.get("available"))
        detail = ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("available",)) if available else str(info.get("why", "not present"))
        wanted = device == name
        sign = hardware_sign(name)
        if not available and not wanted and sign is None:
            continue  # no such hardware here: nothing is missing
        if not available and sign is not None and sign != name:
            detail = f"{detail} (the hardware is there: {sign})"
        hint = {"cuda": "install the NVIDIA driver and a CUDA build of torch", "npu": "install CANN and torch_npu matching your torch"}.get(name, "")
        checks.append(Check(f"device {name}", available, detail, hint, required=wanted))
    try:
        chosen = registry.accelerator(device)
        checks.append(Check("selected device", True, f"{chosen.name} (collectives: {chosen.dist_backend}, bf16: {'yes' if chosen.supports_bf16() else 'no'})"))
    except Exception as exc:
        checks.append(Check("selected device", False, str(exc), "pick another with --device"))

    from mmcore.backends.megatron import status as megatron_status

    usable, why = megatron_status()  # optional: only parallel.backend=megatron needs it
    checks.append(Check("megatron-core", usable, why + (" (parallel.backend=megatron; CPU via mmcore's compatibility layer)" if usable else ""), "pip install 'mmcore[megatron]'", required=False))

    host, port = "127.0.0.1", DEFAULT_RDZV_PORT
    if rdzv_endpoint:
        host, _, port_text = rdzv_endpoint.rpartition(":")
        port = int(port_text)
    free = port_free(host if host not in ("localhost", "") else "127.0.0.1", port)
    checks.append(
        Check(
            "rendezvous port",
            free,
            f"{host}:{port} {'is free' if free else 'is in use'}",
            "a stale torchrun may hold it: stop it, or set parallel.rdzv_endpoint=HOST:PORT to another port",
            required=bool(rdzv_endpoint),
        )
    )

    if hub:
        checks.append(hub_check(offline=offline))

    root = Path(runs_root).absolute()
    probe = root
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 2**30
    checks.append(Check("disk", free_gb >= min_free_gb, f"{free_gb:.1f} GiB free under {root}", f"free some space or use --run-dir on a larger disk (want >= {min_free_gb:g} GiB)"))

    for entry in [*plugins.plugins.values(), *plugins.packs.values()]:
        if entry.error and entry.name != pack:
            checks.append(Check(f"{entry.kind} {entry.name}", False, entry.error, f"fix or uninstall {entry.distribution}", required=False))
    if pack is not None:
        entry = plugins.packs.get(pack)
        if entry is None or not entry.ok:
            checks.append(Check(f"pack {pack}", False, entry.error if entry else "not installed", f"pip install mm-pack-{pack}"))
        else:
            checks.append(Check(f"pack {pack}", True, f"{entry.distribution} {entry.version}"))
            unmet = unmet_requirements(entry.distribution)
            checks.append(
                Check(
                    f"pack {pack} requirements",
                    not unmet,
                    "; ".join(unmet) if unmet else "all satisfied",
                    f"pip install '{entry.distribution}' to repair its requirements, or `mmcore env create --pack {pack}`",
                )
            )
    return checks
