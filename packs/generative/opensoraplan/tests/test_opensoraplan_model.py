"""The pack's own Open-Sora Plan v1.5 denoiser: the sparse attention equals its definition, the
parameter names are the public checkpoint's, save / load is exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_pack_opensoraplan.model import SparseMMAttention, sparse_1d, unsparse_1d
from mm_pack_opensoraplan.transformer import OpenSoraPlanTransformer3DModel

TINY = dict(num_heads=2, head_dim=16, in_channels=4, out_channels=4, num_layers=[2, 2, 2], sparse_n=[1, 2, 1], caption_channels=8, pooled_projection_dim=8, timestep_embed_dim=16)


def group_of(i: torch.Tensor, k: int, group: bool) -> torch.Tensor:
    """The definition: token i is in group i mod k, or in a "group" block (i // k) mod k."""
    return (i // k) % k if group else i % k


@pytest.mark.parametrize("group", [False, True])
@pytest.mark.parametrize("length", [16, 18])  # 18: padded to 20 (a multiple of k^2)
def test_sparse_attention_equals_its_dense_definition(group: bool, length: int) -> None:
    """Video token i attends the video tokens of its group and the text; each text token attends
    the text and one group's video tokens, k times, averaged."""
    torch.manual_seed(0)
    k, b, heads, hd, text_len = 2, 2, 2, 16, 5
    attn = SparseMMAttention(32, heads, hd, True, 1e-6, False, k, group).eval()
    x, text = torch.randn(b, length, 32), torch.randn(b, text_len, 32)
    text_keep = torch.ones(b, text_len, dtype=torch.bool)
    text_keep[1, 3:] = False  # sample 1's last two text tokens are padding
    pos = torch.arange(length).float()
    rope = tuple(t for d in (4, 6, 6) for t in (torch.ones(1, length, 1, d), torch.zeros(1, length, 1, d)))
    rope = (torch.cos(pos)[None, :, None, None].expand(1, length, 1, 4), torch.sin(pos)[None, :, None, None].expand(1, length, 1, 4), *rope[2:])
    video_keep = sparse_1d(torch.ones(b, length, 1), k, group)[..., 0] > 0.5
    keep = torch.cat([video_keep, text_keep.repeat(k, 1)], dim=1)[:, None, None]
    with torch.no_grad():
        got_x, got_text = attn(x, text, keep, rope)
        # dense: every token's queries, keys and values, masks by group
        q = attn.apply_rope(attn.norm_q(attn.heads_of(attn.to_q(x))), rope)
        kk = attn.apply_rope(attn.norm_k(attn.heads_of(attn.to_k(x))), rope)
        v = attn.heads_of(attn.to_v(x))
        tq, tk, tv = attn.norm_added_q(attn.heads_of(attn.add_q_proj(text))), attn.norm_added_k(attn.heads_of(attn.add_k_proj(text))), attn.heads_of(attn.add_v_proj(text))
        Q, K, V = (torch.cat(p, dim=1).transpose(1, 2) for p in ((q, tq), (kk, tk), (v, tv)))
        g = group_of(torch.arange(length), k, group)
        video_rows = (g[:, None] == g[None, :]).expand(b, -1, -1)
        video_mask = torch.cat([video_rows, text_keep[:, None].expand(b, length, text_len)], dim=2)
        full = torch.nn.functional.scaled_dot_product_attention(Q[:, :, :length], K, V, attn_mask=video_mask[:, None]).transpose(1, 2).flatten(2)
        text_out = 0
        for j in range(k):
            mask = torch.cat([(g == j).expand(b, text_len, length), text_keep[:, None].expand(b, text_len, text_len)], dim=2)
            text_out = text_out + torch.nn.functional.scaled_dot_product_attention(Q[:, :, length:], K, V, attn_mask=mask[:, None]).transpose(1, 2).flatten(2) / k
        want_x, want_text = attn.to_out[0](full), attn.to_add_out(text_out)
    torch.testing.assert_close(got_x, want_x, rtol=0, atol=2e-6)
    torch.testing.assert_close(got_text, want_text, rtol=0, atol=2e-6)


def test_sparse_rearrangement_round_trips() -> None:
    x = torch.randn(3, 18, 4)
    for group in (False, True):
        assert torch.equal(unsparse_1d(sparse_1d(x, 3, group), 3, group, 18), x)


def reference_names(num_layers: list[int]) -> set[str]:
    """The parameter names MindSpeed-MM's OpenSoraPlanConverter (v1.5) lists for the 8B model,
    mapped back through its renames to the released model_ema.pt's names."""
    back = {
        "proj_q": "to_q",
        "proj_k": "to_k",
        "proj_v": "to_v",
        "added_proj_q": "add_q_proj",
        "added_proj_k": "add_k_proj",
        "added_proj_v": "add_v_proj",
        "proj_out": "to_out.0",
        "added_proj_out": "to_add_out",
    }
    names = {"norm_out.linear.weight", "norm_out.linear.bias"}
    for i, n in enumerate(num_layers):
        for j in range(n):
            p = f"transformer_blocks.{i}.{j}"
            for proj in ("proj_q", "proj_k", "proj_v", "added_proj_q", "added_proj_k", "added_proj_v"):
                names |= {f"{p}.attn1.{back[proj]}.weight", f"{p}.attn1.{back[proj]}.bias"}
            names |= {f"{p}.ff.net.0.proj.weight", f"{p}.ff_enc.net.0.proj.weight", f"{p}.attn1.to_out.0.weight", f"{p}.attn1.to_add_out.weight", f"{p}.ff.net.2.weight", f"{p}.ff_enc.net.2.weight"}
            names |= {f"{p}.{norm}.linear.{w}" for norm in ("norm1", "norm2") for w in ("weight", "bias")}
    return names


def test_the_8b_config_has_the_public_parameter_names() -> None:
    """The released 8B model's config (MindSpeed-MM's inference_model.json predictor section),
    built without memory: every name the reference converter lists is here (the last block's
    text-side output and FFN aside: that block ends the text stream, context_pre_only)."""
    with torch.device("meta"):
        model = OpenSoraPlanTransformer3DModel()
    names = set(model.state_dict())
    last = "transformer_blocks.6.1"
    expected = {n for n in reference_names([2, 4, 6, 8, 6, 4, 2]) if not n.startswith((f"{last}.attn1.to_add_out", f"{last}.ff_enc"))}
    assert expected <= names, sorted(expected - names)[:5]
    assert f"{last}.norm2.norm_enc.weight" not in names and f"{last}.norm1.norm_enc.weight" in names
    assert {"skip_norm_linear.2.1.weight", "skip_norm_linear_enc.0.1.bias", "norm_final.weight", "norm_out.norm.weight", "patch_embed.proj.weight"} <= names
    assert {"transformer_blocks.0.0.attn1.norm_q.weight", "transformer_blocks.0.0.attn1.norm_added_k.weight", "time_text_embed.text_embedder.linear_2.bias"} <= names
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    assert 8.0 < billions < 8.6, billions  # "8B" in the v1.5 report


def test_save_and_load_give_equal_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = OpenSoraPlanTransformer3DModel(**TINY).eval()
    for p in model.parameters():  # zero-initialised skips and gates would hide a wrong load
        p.data.normal_(0, 0.2)
    inputs = (torch.randn(2, 4, 3, 8, 8), torch.tensor([10.0, 900.0]), torch.randn(2, 6, 8), torch.randn(2, 8))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    with torch.no_grad():
        out = model(*inputs, encoder_attention_mask=mask, return_dict=False)[0]
        masked = model(*inputs, encoder_attention_mask=torch.ones_like(mask), return_dict=False)[0]
    assert out.shape == (2, 4, 3, 8, 8) and not torch.allclose(out[0], masked[0]) and torch.equal(out[1], masked[1])
    model.save_pretrained(tmp_path / "t")
    again = OpenSoraPlanTransformer3DModel.from_pretrained(tmp_path / "t").eval()
    assert again.config.num_layers == [2, 2, 2] and again.config.sparse_n == [1, 2, 1]
    with torch.no_grad():
        assert torch.equal(again(*inputs, encoder_attention_mask=mask, return_dict=False)[0], out)
