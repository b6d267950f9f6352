"""Qwen3.5 MoE: the per-expert tensors transformers saves and the fused ones it holds both
convert to the same model, and the router's auxiliary loss is in the training loss."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from mm_pack_qwen3_5.family import ADAPTER, FAMILY


def test_per_expert_and_fused_checkpoints_convert_to_the_same_model(moe_dir: Path, tmp_path: Path) -> None:
    """``save_pretrained`` writes one tensor per expert (and ``from_pretrained`` fuses them);
    a checkpoint with the fused ``[experts, out, in]`` tensors converts to the same model. The
    round trip of the per-expert folder is bit-exact; exports are per expert, as transformers saves."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5MoeForConditionalGeneration

    from mmcore.checkpoint.training import load_converted
    from mmcore.engines.convert import compare_hf, dcp_to_hf, hf_to_dcp

    (shard,) = moe_dir.glob("*.safetensors")
    tensors = load_file(shard)
    assert any(".mlp.experts.3.gate_proj.weight" in k for k in tensors) and not any(k.endswith("experts.gate_up_proj") for k in tensors)
    reference = Qwen3_5MoeForConditionalGeneration.from_pretrained(moe_dir).eval()
    fused = tmp_path / "fused"
    shutil.copytree(moe_dir, fused)
    held = {k: v.contiguous() for k, v in reference.state_dict().items()}  # the model's own names: experts fused
    assert any(k.endswith(".mlp.experts.gate_up_proj") and v.ndim == 3 for k, v in held.items())
    save_file(held, next(fused.glob("*.safetensors")), metadata={"format": "pt"})
    ids = torch.randint(0, 300, (1, 12))
    for source in (moe_dir, fused):
        adapter = copy.deepcopy(ADAPTER)
        hf_to_dcp(source, tmp_path / f"dcp-{source.name}", adapter)
        model = FAMILY.build_model(moe_dir)
        load_converted(model, tmp_path / f"dcp-{source.name}")
        with torch.no_grad():
            assert torch.equal(model.eval()(input_ids=ids).logits, reference(input_ids=ids).logits), source
        back = tmp_path / f"back-{source.name}"
        dcp_to_hf(tmp_path / f"dcp-{source.name}", back, adapter)
        assert compare_hf(moe_dir, back) == [], source  # exports are per expert


def test_the_router_auxiliary_loss_is_part_of_the_training_loss(moe_dir: Path) -> None:
    from transformers import AutoTokenizer

    from mmcore.train.causal_lm import next_token_loss_sum

    tok = AutoTokenizer.from_pretrained(moe_dir)
    ids = FAMILY.token_ids_of(tok)
    text = tok.apply_chat_template([{"role": "user", "content": "What colour is the shape?"}, {"role": "assistant", "content": "red"}], tokenize=False)
    tokens = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
    raw = {"input_ids": tokens, "labels": tokens.clone()}
    batch = FAMILY.collate([raw, raw], ids)
    model = FAMILY.build_model(moe_dir).eval()
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], mm_token_type_ids=batch["mm_token_type_ids"], output_router_logits=True)
        got = FAMILY.loss_sum(model, batch)
    assert out.aux_loss > 0.5  # 4 experts, 2 per token: the balanced minimum is 1
    coef = model.config.text_config.router_aux_loss_coef
    # per loss token, as transformers' own loss adds it to its token mean
    want = next_token_loss_sum(out.logits, batch["labels"]) + coef * out.aux_loss * batch["num_loss_tokens"]
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
