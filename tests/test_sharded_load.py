"""Building on meta and loading through the engine (mmcore.checkpoint.sharded_load) gives the model that
building for real and loading every weight gives: parameters, persistent and non-persistent
buffers, tied weights."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mmcore.checkpoint.training import load_converted  # noqa: E402
from mmcore.checkpoint.sharded_load import load_weights, materialise, on_meta, parameters_on_meta  # noqa: E402


def build(seed: int = 0) -> "torch.nn.Module":
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    return transformers.Qwen2ForCausalLM(config)


@pytest.fixture
def converted(tmp_path: Path) -> Path:
    """A DCP checkpoint as convert writes it (``model.<name>``, a tied weight stored once)."""
    import torch.distributed.checkpoint as dcp

    model = build(seed=7)
    state = {f"model.{k}": v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    dcp.save(state, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    return tmp_path / "ckpt"


def test_meta_build_then_load_equals_building_and_loading(converted: Path) -> None:
    want = build(seed=1)
    load_converted(want, converted)
    with parameters_on_meta():
        got = build(seed=2)
    assert on_meta(got) and all(b.device.type == "cpu" for b in got.buffers())  # rotary inv_freq computed for real
    materialise(got, torch.device("cpu"))
    load_weights(got, converted, distributed=False)
    assert got.lm_head.weight is got.model.embed_tokens.weight  # still tied
    expected = dict(want.named_buffers()) | want.state_dict()
    actual = dict(got.named_buffers()) | got.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name
    ids = torch.randint(0, 96, (1, 10))
    with torch.no_grad():
        assert torch.equal(got(input_ids=ids).logits, want(input_ids=ids).logits)


def test_building_on_meta_allocates_no_parameter_memory() -> None:
    with parameters_on_meta():
        model = build()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert torch.nn.Linear(4, 4).weight.device.type == "cpu"  # the patch is gone after the block
