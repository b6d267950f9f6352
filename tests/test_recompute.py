"""Activation recompute (mmcore.train.recompute): the same losses and gradients as keeping every
activation. (How much memory it saves is measured in bench/recompute_memory.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mmcore.train.recompute import apply_recompute  # noqa: E402


def tiny_decoder() -> "transformers.PreTrainedModel":
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    config._attn_implementation = "sdpa"
    return transformers.Qwen2ForCausalLM(config).train()


def step(mode: str) -> tuple[float, dict[str, "torch.Tensor"]]:
    model = tiny_decoder()
    assert apply_recompute(list(model.model.layers), mode) == (0 if mode == "none" else 3)
    ids = torch.randint(0, 96, (2, 48), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_gives_the_same_loss_and_gradients(mode: str) -> None:
    base_loss, base_grads = step("none")
    loss, grads = step(mode)
    assert loss == base_loss  # the same ops on the same inputs: bit-identical
    for name, grad in base_grads.items():
        assert torch.equal(grads[name], grad), name


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="training.recompute must be one of none, full, selective"):
        apply_recompute([], "some")
