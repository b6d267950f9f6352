"""Sigmoid routing (``scoring_func: sigmoid``, ``topk_method: noaux_tc``), read onto transformers'
DeepSeek-V3 decoder: its router picks and weighs the experts the public gate does, its MLA layers
compute what the DeepSeek-V2 class computes from the same weights, and the checkpoint converts
and trains through the pack's path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_pack_deepseek_vl2.model import DeepseekVL2ForCausalLM


@pytest.fixture(scope="module")
def sigmoid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_deepseek_vl2.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("sigmoid") / "model"
    build_init_checkpoint("tiny-sigmoid", out, seed=0)
    return out


def public_gate(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, fields: dict) -> list[dict[int, float]]:
    """DeepSeek-VL2's ``MoEGate`` with ``noaux_tc`` (its ``modeling_deepseek.py``), restated in
    float64: sigmoid scores; the bias is added for choosing only; each group is worth its best two
    biased scores; the best ``topk_group`` groups stay, the others' scores become 0; the top-k of
    what is left are chosen and weighed by their unbiased scores, renormalised when more than one
    is chosen, times ``routed_scaling_factor``. Per token: expert -> weight."""
    scores = (hidden.double() @ weight.double().T).sigmoid()
    choice = scores + bias.double()
    tokens, experts, groups = scores.shape[0], scores.shape[1], fields["n_group"]
    group_scores = choice.view(tokens, groups, -1).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(fields["topk_group"], dim=-1).indices, 1.0)
    masked = choice.masked_fill(~keep.repeat_interleave(experts // groups, dim=1).bool(), 0.0)
    chosen = masked.topk(fields["num_experts_per_tok"], dim=-1).indices
    weights = scores.gather(1, chosen)
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * fields["routed_scaling_factor"]
    return [dict(zip(c.tolist(), w.tolist())) for c, w in zip(chosen, weights)]


def test_the_router_picks_and_weighs_as_the_public_gate(sigmoid_dir: Path) -> None:
    """Tolerance: transformers' router works in float32, the restatement in float64; the picks
    must be the same experts, the weights within float32 rounding (1e-6)."""
    model = DeepseekVL2ForCausalLM.from_pretrained(sigmoid_dir)
    fields = model.config.language_config
    gate = model.language.model.layers[1].mlp.gate
    assert type(model.language.model).__name__ == "DeepseekV3Model" and gate.e_score_correction_bias.abs().sum() > 0  # the checkpoint's bias, loaded
    hidden = torch.randn(200, model.config.text_config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, weights, chosen = gate(hidden)
    want = public_gate(hidden, gate.weight, gate.e_score_correction_bias, fields)
    for token, (c, w) in enumerate(zip(chosen.tolist(), weights.tolist())):
        got = dict(zip(c, w))
        assert got.keys() == want[token].keys(), token
        assert all(abs(got[e] - want[token][e]) < 1e-6 for e in got), token


def test_mla_layers_compute_what_the_deepseek_v2_class_computes(sigmoid_dir: Path) -> None:
    """The first layer is dense (``first_k_dense_replace: 1``), so it is attention alone apart from
    routing: built as DeepSeek-V3 (interleaved RoPE by a permutation) and as DeepSeek-V2 (complex
    RoPE) from the same weights, its outputs agree to float32 rounding."""
    import json

    from mm_pack_deepseek_vl2.model import DeepseekVL2Config

    v3 = DeepseekVL2ForCausalLM.from_pretrained(sigmoid_dir)
    fields = json.loads((sigmoid_dir / "config.json").read_text())
    fields["language_config"].update(scoring_func="softmax", topk_method="greedy", norm_topk_prob=False)
    v2 = DeepseekVL2ForCausalLM(DeepseekVL2Config(**fields)).eval()
    missing, unexpected = v2.load_state_dict(v3.state_dict(), strict=False)
    assert missing == [] and unexpected == ["language.model.layers.1.mlp.gate.e_score_correction_bias"]
    ids = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = v3.language.model(input_ids=ids, output_hidden_states=True).hidden_states[1]
        b = v2.language.model(input_ids=ids, output_hidden_states=True).hidden_states[1]
    assert type(v2.language.model).__name__ == "DeepseekV2Model"
    assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()


def test_a_sigmoid_routed_checkpoint_trains_and_exports(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The user's path with ``init:tiny-sigmoid``: convert (verified bit for bit both ways), a few
    training steps, the export reloads logit for logit, and the routing bias comes back unchanged
    (a fixed buffer, as DeepSeek-V3 holds it between its bias updates; nothing trains it here)."""
    from safetensors import safe_open

    from mmcore.testing import stage_manifest as manifest

    mm(
        "run",
        "--pack",
        "deepseek-vl2",
        "--preset",
        "demo",
        "model.source=init:tiny-sigmoid",
        "convert.verify=true",
        "data.demo_samples=24",
        "training.steps=2",
        "training.checkpoint_every=2",
        "evaluate.enabled=false",
        "--run-dir",
        "r",
    )
    assert manifest(tmp_path / "r", "export")["metrics"]["logits_max_abs_diff"] == 0.0
    key = "language.model.layers.1.mlp.gate.e_score_correction_bias"
    with safe_open(tmp_path / "r/download/model/model.safetensors", "pt") as source, safe_open(tmp_path / "r/export/hf/model.safetensors", "pt") as export:
        assert source.get_tensor(key).abs().sum() > 0 and torch.equal(source.get_tensor(key), export.get_tensor(key))


def test_other_routing_is_refused_in_one_line() -> None:
    from mm_pack_deepseek_vl2.model import DeepseekVL2Config

    with pytest.raises(ValueError, match="sigmoid routing is read with topk_method 'noaux_tc' and MLA"):
        DeepseekVL2Config(language_config={"num_hidden_layers": 2, "scoring_func": "sigmoid", "topk_method": "greedy"})
    with pytest.raises(ValueError, match="scoring_func 'softmax' with norm_topk_prob True"):
        DeepseekVL2Config(language_config={"num_hidden_layers": 2, "norm_topk_prob": True})
