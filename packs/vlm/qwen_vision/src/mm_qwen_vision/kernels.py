"""The Qwen text kernels every Qwen VL pack registers under its own name, and their wiring.

Each kernel has a portable reference (plain torch, runs everywhere, the ground truth of the
parity tests) and an NPU version on torch_npu's fused ops (imported only where torch_npu is
importable). A pack registers ``qwen_kernels("qwen2vl")`` (names ``qwen2vl.rms_norm``,
``qwen2vl.rotary``) so two packs installed together never claim the same name; packed attention
is the core's ``varlen_attention`` kernel (:mod:`mmcore.train.attention`), wired by the VLM kit.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

from mmcore import hookimpl

OPS = "mm_qwen_vision.ops"


def qwen_kernels(prefix: str, rotary: bool = True) -> list[Any]:
    """The KernelSpecs of ``<prefix>.rms_norm`` and (``rotary``) ``<prefix>.rotary``, reference
    and NPU. ``rotary=False`` for a family whose text rotary is not rotate-half (GLM's
    interleaved pairs)."""
    from mmcore import KernelSpec

    specs = [
        KernelSpec(f"{prefix}.rms_norm", "reference", f"{OPS}:rms_norm", summary="RMSNorm in fp32, cast back", example=f"{OPS}:rms_norm_example"),
        KernelSpec(f"{prefix}.rms_norm", "npu", f"{OPS}:rms_norm_npu", requires=("torch_npu",), summary="torch_npu.npu_rms_norm"),
        KernelSpec(f"{prefix}.rotary", "reference", f"{OPS}:apply_rotary", summary="rotate-half rotary embedding", example=f"{OPS}:rotary_example"),
        KernelSpec(f"{prefix}.rotary", "npu", f"{OPS}:apply_rotary_npu", requires=("torch_npu",), summary="torch_npu.npu_rotary_mul"),
    ]
    return specs if rotary else [spec for spec in specs if not spec.name.endswith(".rotary")]


@dataclass(frozen=True, eq=False)  # hashed by identity, as pluggy keeps plugins in sets
class QwenKernelsPack:
    """A pack's entry-point object that also registers the Qwen text kernels under the pack's
    prefix (``mmcore.packs`` entry points may be any object with a ``PACK``).

    Args:
        PACK: the pack's declaration.
        prefix: kernel name prefix (``"qwen2vl"`` -> ``qwen2vl.rms_norm``).
        rotary: also the rotate-half rotary kernel (False where the family's rotary differs).
    """

    PACK: Any
    prefix: str
    rotary: bool = True

    @hookimpl
    def mmcore_register_kernels(self, register: Any) -> None:
        for spec in qwen_kernels(self.prefix, self.rotary):
            register(spec)


def apply_kernels(model: Any, registry: Any, device: str, prefix: str, rotary: bool = True) -> list[str]:
    """Route the model's RMSNorms and the text attention's rotary embedding through this
    device's ``<prefix>.*`` kernels, where it has them.

    Returns the names changed (none where the reference is what runs: the transformers
    implementation is then used as is, and the parity tests hold them equal). The rotary
    function is swapped in the transformers modeling module (its attention looks it up there
    at each call, with no per-model hook), so it holds for every model of that module in this
    process, which all run on this device.
    """
    changed = []
    norm = registry.kernel_spec(f"{prefix}.rms_norm", device)
    if norm.device != "reference":
        kernel = norm.load()
        for name, module in model.named_modules():
            if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
                module.forward = functools.partial(lambda m, x: kernel(x, m.weight, m.variance_epsilon), module)
                changed.append(name)
    spec = registry.kernel_spec(f"{prefix}.rotary", device) if rotary else None
    if spec is not None and spec.device != "reference":
        rotate = spec.load()

        def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> tuple[Any, Any]:
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            return rotate(q, cos, sin), rotate(k, cos, sin)

        modeling = {sys.modules[type(m).__module__] for m in model.modules() if type(m).__name__.endswith("Attention")}
        for module in sorted((m for m in modeling if hasattr(m, "apply_rotary_pos_emb")), key=lambda m: m.__name__):
            module.apply_rotary_pos_emb = apply_rotary_pos_emb
            changed.append(f"{module.__name__}.apply_rotary_pos_emb")
    return changed
