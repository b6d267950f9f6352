"""The mixture of experts: transformers' DeepSeek-V3 decoder computes no router load-balancing
loss (its config has no ``router_aux_loss_coef``; DeepSeek-V3 balances its experts with a
selection bias, ``e_score_correction_bias``, a buffer that pretraining moved outside the
gradient), so the kit adds none: the training loss is the next-token loss alone, the router and
experts train, the bias stays as loaded."""

from __future__ import annotations

from pathlib import Path

import torch


def test_no_router_loss_is_added_and_the_selection_bias_gets_no_gradient(tiny_dir: Path) -> None:
    from mmcore.train import next_token_loss_sum
    from mm_pack_kimi_k25.family import FAMILY

    model = FAMILY.build_model(tiny_dir)
    text = model.config.get_text_config()
    assert getattr(text, "router_aux_loss_coef", None) is None and text.n_routed_experts == 4 and text.first_k_dense_replace == 1
    ids = torch.randint(0, 300, (2, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone(), "num_loss_tokens": 30}
    loss = FAMILY.loss_sum(model, batch)
    assert torch.equal(loss, next_token_loss_sum(FAMILY.forward_logits(model, batch), batch["labels"]))
    loss.backward()
    experts = model.model.language_model.layers[1].mlp
    assert experts.experts.gate_up_proj.grad is not None and experts.gate.weight.grad is not None
    # a buffer: in the checkpoint (converted and exported), not among the trained parameters
    name = "model.language_model.layers.1.mlp.gate.e_score_correction_bias"
    assert name in model.state_dict() and name not in dict(model.named_parameters())
