"""Kernels every pack can use (implementations in :mod:`mmcore.train.attention`).

``varlen_attention``: attention over packed sequences (TND layout, ``cu_seqlens``), which the
VLM kit wires into the text decoder of a packed training run.
"""

from __future__ import annotations

from mmcore import hookimpl
from mmcore.framework.registry import KernelSpec

KERNELS = [
    KernelSpec(
        "varlen_attention", "reference", "mmcore.train.attention:varlen_attention", summary="SDPA per packed sequence (no T x T mask)", example="mmcore.train.attention:varlen_attention_example"
    ),
    KernelSpec("varlen_attention", "cuda", "mmcore.train.attention:varlen_attention_flash", requires=("flash_attn",), summary="flash_attn_varlen_func"),
    KernelSpec("varlen_attention", "npu", "mmcore.train.attention:varlen_attention_npu", requires=("torch_npu",), summary="torch_npu.npu_fusion_attention (TND)"),
]


@hookimpl
def mmcore_register_kernels(register):
    for spec in KERNELS:
        register(spec)
