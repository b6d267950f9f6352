"""Print the environment that makes torch's CPU math take another instruction set than it does here.

Machines of one kind come with different Xeons (AVX-512 and AMX on some, AVX2 on others), and
ATen, oneDNN and MKL pick kernels by instruction set, so float results differ in the last bits
between them. ``make test`` reruns the tests that compare runs (marker ``compares_runs``) under
the variables printed here, to find a knife-edge test before another machine does:

    env $(python tools/other_isa.py) python -m pytest -m compares_runs

AVX-512 here -> AVX2; AVX2 here -> SSE4 (ATen's unvectorised kernels); anything else -> nothing.
"""

from __future__ import annotations

import torch

capability = torch.backends.cpu.get_cpu_capability().upper()
if capability.startswith("AVX512"):
    print("ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2")
elif capability == "AVX2":
    print("ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2")
