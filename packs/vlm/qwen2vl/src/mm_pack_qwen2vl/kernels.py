"""The kernels this pack registers, per device. Implementations live in ``mm_pack_qwen2vl.ops``.

Each kernel has a portable reference (plain torch, runs everywhere, the ground truth of the
parity tests) and device versions: NPU through torch_npu's fused ops (imported only where
torch_npu is importable).

``rms_norm`` and ``rotary`` are wired into the model (``family.apply_kernels``) where the
device has its own; packed attention is the core's ``varlen_attention`` kernel
(:mod:`mmcore.attention`), wired by the VLM kit.
"""

from mmcore.registry import KernelSpec

KERNELS = [
    KernelSpec("qwen2vl.rms_norm", "reference", "mm_pack_qwen2vl.ops:rms_norm", summary="RMSNorm in fp32, cast back", example="mm_pack_qwen2vl.ops:rms_norm_example"),
    KernelSpec("qwen2vl.rms_norm", "npu", "mm_pack_qwen2vl.ops:rms_norm_npu", requires=("torch_npu",), summary="torch_npu.npu_rms_norm"),
    KernelSpec("qwen2vl.rotary", "reference", "mm_pack_qwen2vl.ops:apply_rotary", summary="rotate-half rotary embedding", example="mm_pack_qwen2vl.ops:rotary_example"),
    KernelSpec("qwen2vl.rotary", "npu", "mm_pack_qwen2vl.ops:apply_rotary_npu", requires=("torch_npu",), summary="torch_npu.npu_rotary_mul"),
]
