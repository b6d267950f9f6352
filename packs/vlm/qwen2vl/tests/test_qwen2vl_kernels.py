"""Kernel parity: each device kernel against the reference, the reference against transformers."""

from __future__ import annotations

import pytest
import torch

from mm_qwen_vision import ops
from mmcore.framework.plugins import Plugins


def test_reference_rms_norm_matches_transformers() -> None:
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    norm = Qwen2RMSNorm(32, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    norm = norm.to(torch.bfloat16)
    assert torch.equal(ops.rms_norm(x, norm.weight, 1e-6), norm(x))


def test_reference_rotary_matches_transformers() -> None:
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 2, 7, 16)
    angles = torch.randn(2, 7, 8)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(ops.apply_rotary(q, cos[:, None], sin[:, None]), q_ref, atol=1e-6)
    assert torch.allclose(ops.apply_rotary(k, cos[:, None], sin[:, None]), k_ref, atol=1e-6)


DEVICE_PARITY = {
    "qwen2vl.rms_norm": lambda f, dev: f(torch.randn(4, 64, device=dev), torch.randn(64, device=dev), 1e-6),
    "qwen2vl.rotary": lambda f, dev: f(torch.randn(1, 8, 2, 16, device=dev), torch.randn(1, 8, 1, 16, device=dev), torch.randn(1, 8, 1, 16, device=dev)),
}


@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
@pytest.mark.parametrize("kernel", sorted(DEVICE_PARITY))
def test_device_kernel_matches_reference(kernel: str, device: str) -> None:
    registry = Plugins.load().registry
    accelerator = registry.accelerators[device]
    if not accelerator.is_available():
        pytest.skip(f"no {device} device here")
    spec = registry.kernel_spec(kernel, device)
    torch.manual_seed(0)
    dev = accelerator.device(0)
    got = DEVICE_PARITY[kernel](spec.load(), dev)
    torch.manual_seed(0)
    want = DEVICE_PARITY[kernel](registry.kernel_spec(kernel, "reference").load(), dev)
    assert torch.allclose(got.float(), want.float(), atol=2e-3, rtol=2e-3), f"{kernel} on {device} ({spec.impl})"


def test_model_uses_a_device_kernel_when_there_is_one(tiny_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from mm_pack_qwen2vl.kernels import KERNELS
    from mm_pack_qwen2vl.family import FAMILY, apply_kernels
    from mmcore.framework.registry import KernelSpec, Registry

    registry = Registry()
    for spec in KERNELS:
        registry.add_kernel(spec, "pack:qwen2vl")
    model = FAMILY.build_model(tiny_dir).eval()
    ids = torch.randint(0, 300, (1, 9))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    assert apply_kernels(model, registry, "cpu") == []  # only the reference here: nothing to swap
    registry.add_kernel(KernelSpec("qwen2vl.rms_norm", "cpu", "mm_qwen_vision.ops:rms_norm"), "test")
    changed = apply_kernels(model, registry, "cpu")
    assert len(changed) == 2 * model.config.text_config.num_hidden_layers + 1  # two per layer + the final norm
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, want)
    # rotary: swapped in the modeling module (restored after the test by monkeypatch)
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    monkeypatch.setattr(modeling_qwen2_vl, "apply_rotary_pos_emb", modeling_qwen2_vl.apply_rotary_pos_emb)
    original = modeling_qwen2_vl.apply_rotary_pos_emb
    registry.add_kernel(KernelSpec("qwen2vl.rotary", "cpu", "mm_qwen_vision.ops:apply_rotary"), "test")
    assert "transformers.models.qwen2_vl.modeling_qwen2_vl.apply_rotary_pos_emb" in apply_kernels(model, registry, "cpu")
    assert modeling_qwen2_vl.apply_rotary_pos_emb is not original
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, want)  # the reference is transformers' arithmetic
