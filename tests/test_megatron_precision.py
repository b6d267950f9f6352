"""bf16 compute on the megatron backend (mmcore.backends.megatron.precision.Bf16Compute): bf16 weights
inside a step, the fp32 weights untouched outside it, micro-batch gradients summed in fp32.
(The engine's bf16 run at PP=2 is in the qwen2vl pack's megatron engine test.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mmcore.backends.megatron.precision import Bf16Compute  # noqa: E402


def test_a_step_computes_in_bf16_and_leaves_the_fp32_weights_as_they_were() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    model[0].requires_grad_(False)  # frozen: computes in bf16 too, gets no gradient
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    precision = Bf16Compute(model.parameters())
    x = torch.randn(4, 8)
    with precision.step():
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        out = model(x.bfloat16())
        assert out.dtype == torch.bfloat16
        out.float().sum().backward()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, before[name]), name  # the bf16 round trip does not touch the weights
    assert model[0].weight.grad is None
    grad = model[1].weight.grad
    assert grad is not None and grad.dtype == torch.float32
    # d(sum of outputs)/d(second weight) = the first layer's outputs summed over the batch; from
    # the bf16 forward, the fp32 one to bf16's precision (8 significant bits: ~4e-3 relative)
    with torch.no_grad():
        reference = model[0](x).sum(0, keepdim=True)
    assert torch.allclose(grad, reference, rtol=2e-2, atol=2e-2) and not torch.equal(grad, reference)


def test_micro_batch_gradients_are_summed_in_fp32() -> None:
    # 1 + 2**-9 is not a bf16 number (8 significant bits): autograd summing the two micro-batches'
    # bf16 gradients in the bf16 parameter's .grad would give 1.0
    weight = torch.nn.Parameter(torch.ones(()))
    precision = Bf16Compute([weight])
    with precision.step():
        for x in (1.0, 2.0**-9):
            (weight * torch.tensor(x, dtype=torch.bfloat16)).float().backward()
    assert weight.grad is not None and weight.grad.dtype == torch.float32
    assert weight.grad.item() == 1 + 2.0**-9


def test_an_error_inside_a_step_leaves_the_fp32_weights() -> None:
    layer = torch.nn.Linear(2, 2)
    weight = layer.weight.detach().clone()
    with pytest.raises(RuntimeError, match="boom"):
        with Bf16Compute(layer.parameters()).step():
            raise RuntimeError("boom")
    assert layer.weight.dtype == torch.float32 and torch.equal(layer.weight, weight)


def test_disabled_it_changes_nothing() -> None:
    layer = torch.nn.Linear(2, 2)
    with Bf16Compute(layer.parameters(), enabled=False).step():
        assert layer.weight.dtype == torch.float32
        layer(torch.ones(1, 2)).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
