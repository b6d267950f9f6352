"""The model's own maths: per-modality routing, norm_head, the merged-embedding forward on a
padded mixed batch, gradients. (Agreement with the reference code is tools/reference_check.py's,
run by hand: the README's figures.)"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from mm_pack_ming.moe import AUDIO, IMAGE, TEXT


def _samples(folder: Path, model) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    v, g = model.config.vision, torch.Generator().manual_seed(0)
    image = tok("<role>HUMAN</role><image>" + "<imagePatch>" * 6 + "</image>What colour?<role>ASSISTANT</role>red<|endoftext|>")["input_ids"]
    audio = tok("<role>HUMAN</role><audio>" + "<audioPatch>" * 5 + "</audio>Which tone?<role>ASSISTANT</role>high<|endoftext|>")["input_ids"]
    text = tok("<role>HUMAN</role>What colour is a red square?<role>ASSISTANT</role>red<|endoftext|>")["input_ids"]
    return [
        {"input_ids": torch.tensor([image]), "pixel_values": torch.randn(24, 3 * v["temporal_patch_size"] * v["patch_size"] ** 2, generator=g), "image_grid_thw": torch.tensor([[1, 4, 6]])},
        {"input_ids": torch.tensor([audio]), "audio_feats": torch.randn(1, 5, 560, generator=g), "audio_feats_lengths": torch.tensor([5]), "audio_token_id": tok.convert_tokens_to_ids("<audioPatch>")},
        {"input_ids": torch.tensor([text])},
    ]


def _with_labels(s: dict) -> dict:  # type: ignore[type-arg]
    labels = s["input_ids"].clone()
    labels[:, : labels.shape[1] // 2] = -100
    return {**s, "labels": labels}


def test_each_modality_takes_its_own_router(tiny_model) -> None:  # type: ignore[no-untyped-def]
    moe = tiny_model.model.model.layers[0].mlp
    x = torch.randn(1, 6, tiny_model.config.llm.hidden_size, generator=torch.Generator().manual_seed(1))
    modality = torch.tensor([[TEXT, IMAGE, AUDIO, TEXT, IMAGE, AUDIO]])
    with torch.no_grad():
        base = moe(x, modality)
        chosen = moe.image_gate(x[0, 1:2])[0][0].tolist()
        pair = [chosen[0], next(e for e in range(len(moe.experts)) if e not in chosen)]
        rows = moe.image_gate.weight[pair].clone()
        moe.image_gate.weight[pair] = rows.flip(0)  # token 1's first expert trades places with one it did not pick
        swapped = moe(x, modality)
        moe.image_gate.weight[pair] = rows
        index, _ = moe.route(x[0], modality[0])
    moved = (swapped - base).abs().amax(-1)[0]
    assert moved[1] > 1e-2 and moved[[0, 2, 3, 5]].max() < 1e-5  # others: rounding of a differently sized expert batch
    assert torch.equal(index[0], moe.gate(x[0, :1])[0][0]) and torch.equal(index[1], moe.image_gate(x[0, 1:2])[0][0]) and torch.equal(index[2], moe.audio_gate(x[0, 2:3])[0][0])


def test_norm_head_divides_lm_head_by_its_column_norms(tiny_model) -> None:  # type: ignore[no-untyped-def]
    lm = tiny_model.model
    h = torch.randn(3, tiny_model.config.llm.hidden_size)
    w = lm.lm_head.weight
    assert torch.allclose(lm.logits(h), F.linear(h, w / (w.norm(dim=0, keepdim=True) + 1e-7)), atol=1e-6)
    assert not torch.allclose(lm.logits(h), lm.lm_head(h), atol=1e-3)


def test_a_padded_mixed_batch_gives_each_sample_its_own_logits_and_trains(tiny_dir: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    samples = [_with_labels(s) for s in _samples(tiny_dir, tiny_model)]
    model = tiny_model.eval()
    with torch.no_grad():
        alone = [model(**s) for s in samples]
    longest = max(s["input_ids"].shape[1] for s in samples)
    pad = lambda t, v: F.pad(t, (0, longest - t.shape[1]), value=v)  # noqa: E731
    batch = {
        "input_ids": torch.cat([pad(s["input_ids"], 0) for s in samples]),
        "labels": torch.cat([pad(s["labels"], -100) for s in samples]),
        "attention_mask": torch.cat([pad(torch.ones_like(s["input_ids"]), 0) for s in samples]),
        **{k: samples[0][k] for k in ("pixel_values", "image_grid_thw")},
        **{k: samples[1][k] for k in ("audio_feats", "audio_feats_lengths", "audio_token_id")},
    }
    model.train()
    out = model(**batch)
    for i, s in enumerate(samples):
        n = s["input_ids"].shape[1]
        assert torch.allclose(out["logits"][i, :n], alone[i]["logits"][0], atol=1e-5)
    # the batch's loss is the token mean over all three samples' targets
    total = sum(float(a["ce"].sum()) for a in alone)
    count = sum(int(a["tokens"]) for a in alone)
    assert abs(float(out.loss) - total / count) < 1e-5
    model.zero_grad()
    out.loss.backward()
    layer = model.model.model.layers[0].mlp
    for part in (
        layer.gate.weight,
        layer.image_gate.weight,
        layer.audio_gate.weight,
        model.linear_proj[0].weight,
        model.linear_proj_audio[0].weight,
        model.vision.blocks[0].attn.qkv.weight,
        model.audio.encoders0[0].self_attn.fsmn_block.weight,
    ):
        assert part.grad is not None and part.grad.abs().sum() > 0
    model.zero_grad()
    model.eval()


def test_generation_with_the_kv_cache_writes_what_recomputing_writes(tiny_dir: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    samples = _samples(tiny_dir, tiny_model)
    longest = max(s["input_ids"].shape[1] for s in samples)
    left = lambda t, v: F.pad(t, (longest - t.shape[1], 0), value=v)  # noqa: E731
    prompts = {
        "input_ids": torch.cat([left(s["input_ids"], 0) for s in samples]),
        "attention_mask": torch.cat([left(torch.ones_like(s["input_ids"]), 0) for s in samples]),
        **{k: samples[0][k] for k in ("pixel_values", "image_grid_thw")},
        **{k: samples[1][k] for k in ("audio_feats", "audio_feats_lengths", "audio_token_id")},
    }
    model = tiny_model.eval()
    cached = model.generate(**prompts, max_new_tokens=12, eos_token_id=[], pad_token_id=0)
    again = model.generate(**prompts, max_new_tokens=12, eos_token_id=[], pad_token_id=0, use_cache=False)
    assert cached.shape == (3, longest + 12) and torch.equal(cached, again)
    assert len(set(cached[:, longest:].flatten().tolist())) > 3  # not one token repeated: the check can fail
