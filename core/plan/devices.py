"""The devices ``mmcore plan`` plans for: memory per device and dense bf16 peak FLOP/s.

Peaks come from the accelerator table the engine's MFU metric reads
(:data:`mmcore.framework.accelerator.PEAK_BF16_FLOPS`), so a planned MFU and a measured one
divide by the same number. Memory is the total the device reports (``nvidia-smi`` /
``npu-smi``), not the marketing figure: H100 SXM 80GB 81,559 MiB (79.6 GiB), H200 141GB
143,771 MiB (140.4 GiB; about 139.8 GiB as torch reports it, the figure used), A100 SXM4 80GB 81,920
MiB (about 79.2 GiB as torch reports it), Ascend 910B3/B4 64 GB HBM2e (65,536 MB). Peak bf16 dense: NVIDIA's H100/H200
(989 TFLOPS) and A100 (312 TFLOPS) data sheets; Ascend 910B3/B4 313 TFLOPS (Huawei Atlas 800T A2
specifications; 910B2: 376), as the accelerator table holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmcore.framework.accelerator import peak_of

GIB = 2**30


@dataclass(frozen=True)
class Device:
    """One device kind: ``memory`` in bytes the framework can allocate, ``peak`` dense bf16 FLOP/s."""

    name: str
    memory: float
    peak: float
    #: host <-> device bandwidth in bytes/s, for CPU offload's transfers (PCIe 5 x16 / HCCS host link)
    host_link: float = 50e9
    #: device <-> device bandwidth within a node, bytes/s each way, for Ulysses' all-to-alls
    #: (NVLink 4: 450 GB/s; NVLink 3: 300 GB/s; the 910B's HCCS: 196 GB/s, 7 links of 28, an assumption)
    peer_link: float = 450e9
    #: device <-> device bandwidth across nodes, bytes/s each way per device, for FSDP's
    #: collectives over more ranks than a node has (one 400 Gb/s NIC per H100/H200: 50 GB/s; one
    #: 200 Gb/s per A100 and per 910B (its 8 x 200GE RoCE ports a node): 25 GB/s; assumptions)
    node_link: float = 50e9


def _device(name: str, reported: str, memory_gib: float, host_link: float = 50e9, peer_link: float = 450e9, node_link: float = 50e9) -> Device:
    peak = peak_of(reported)
    assert peak is not None, f"{reported} is not in mmcore.framework.accelerator.PEAK_BF16_FLOPS"
    return Device(name, memory_gib * GIB, peak, host_link, peer_link, node_link)


#: ``--device`` names -> devices; the second argument is the name torch reports, looked up in
#: the accelerator's peak table
DEVICES: dict[str, Device] = {
    "h100": _device("H100 80GB", "NVIDIA H100 80GB HBM3", 79.6),
    "h200": _device("H200 141GB", "NVIDIA H200", 139.8),
    "a100": _device("A100 80GB", "NVIDIA A100-SXM4-80GB", 79.2, host_link=25e9, peer_link=300e9, node_link=25e9),
    "910b": _device("Ascend 910B 64GB", "Ascend910B3", 64.0, host_link=25e9, peer_link=196e9, node_link=25e9),
}


def device_of(name: str) -> Device:
    """The device ``name`` (``h100``, ``H100``, ``910B``, ...)."""
    key = name.lower().replace("ascend", "").replace(" ", "").replace("-", "")
    for known, device in DEVICES.items():
        if key.startswith(known):
            return device
    from mmcore.errors import UsageError

    raise UsageError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")


__all__ = ["Device", "DEVICES", "GIB", "device_of"]
