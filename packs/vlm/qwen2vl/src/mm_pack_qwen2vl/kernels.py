"""The kernels this pack registers, per device. Implementations live in ``mm_pack_qwen2vl.ops``.

Each kernel has a portable reference (plain torch, runs everywhere, the ground truth of the
parity tests) and device versions: NPU through torch_npu's fused ops (imported only where
torch_npu is importable), CUDA through flash-attn's varlen kernel where installed.

Only ``rms_norm`` is wired into the model (``model.apply_kernels``); ``rotary`` and
``varlen_attention`` are registered and parity-tested, and ``mmcore info`` says they are not
called yet (wiring attention kernels is the train engine's issue).
"""

from mmcore.registry import KernelSpec

KERNELS = [
    KernelSpec("qwen2vl.rms_norm", "reference", "mm_pack_qwen2vl.ops:rms_norm", summary="RMSNorm in fp32, cast back", example="mm_pack_qwen2vl.ops:rms_norm_example"),
    KernelSpec("qwen2vl.rms_norm", "npu", "mm_pack_qwen2vl.ops:rms_norm_npu", requires=("torch_npu",), summary="torch_npu.npu_rms_norm"),
    KernelSpec("qwen2vl.rotary", "reference", "mm_pack_qwen2vl.ops:apply_rotary", summary="rotate-half rotary embedding", example="mm_pack_qwen2vl.ops:rotary_example", wired=False),
    KernelSpec("qwen2vl.rotary", "npu", "mm_pack_qwen2vl.ops:apply_rotary_npu", requires=("torch_npu",), summary="torch_npu.npu_rotary_mul", wired=False),
    KernelSpec("qwen2vl.varlen_attention", "reference", "mm_pack_qwen2vl.ops:varlen_attention", summary="SDPA with a block-diagonal causal mask", example="mm_pack_qwen2vl.ops:varlen_attention_example", wired=False),
    KernelSpec("qwen2vl.varlen_attention", "cuda", "mm_pack_qwen2vl.ops:varlen_attention_flash", requires=("flash_attn",), summary="flash_attn_varlen_func", wired=False),
    KernelSpec("qwen2vl.varlen_attention", "npu", "mm_pack_qwen2vl.ops:varlen_attention_npu", requires=("torch_npu",), summary="torch_npu.npu_fusion_attention (TND)", wired=False),
]
