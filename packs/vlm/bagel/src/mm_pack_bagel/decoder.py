"""BAGEL's Mixture-of-Transformers decoder: a Qwen2.5 decoder in which every layer holds two
experts, one for understanding tokens (text and ViT features) and one (``*_moe_gen``) for the
generation tokens (noised VAE latents). Each expert has its own q/k/v/o projections, q/k
RMSNorms, layer norms and MLP; the attention itself is one softmax over the whole packed row,
so the two kinds of tokens read each other.

Parameter names are the release's (``ema.safetensors``: ``language_model.model.layers.N...``).
The packed row's attention pattern comes from :func:`block_mask` (per sample, per split:
``causal`` text, ``full`` image blocks, ``noise`` latents that nothing outside their own split
may read); torch SDPA takes it as a dense boolean mask, which is what flex-attention's block
mask evaluates to on small rows.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm, Qwen2RotaryEmbedding, apply_rotary_pos_emb

ATTENTION_MODES = ("causal", "full", "noise")


def block_mask(sample_lens: Sequence[int], split_lens: Sequence[int], attn_modes: Sequence[str], device: torch.device | str = "cpu") -> torch.Tensor:
    """The packed row's ``[L, L]`` boolean mask (True: the query may read the key).

    A query reads keys of its own sample only; inside it, every earlier key (causal), every key
    of its own ``full``/``noise`` split, and never a ``noise`` split other than its own (noised
    latents are the target of one sample and must not leak into later text or images).
    """
    if len(split_lens) != len(attn_modes):
        raise ValueError(f"split_lens has {len(split_lens)} entries but attn_modes {len(attn_modes)}")
    bad = [m for m in attn_modes if m not in ATTENTION_MODES]
    if bad:
        raise ValueError(f"attn_modes: {bad[0]!r} is not one of {', '.join(ATTENTION_MODES)}")
    total = sum(sample_lens)
    if sum(split_lens) != total:
        raise ValueError(f"split_lens add up to {sum(split_lens)} but sample_lens to {total}")
    split = torch.repeat_interleave(torch.arange(len(split_lens), device=device), torch.tensor(list(split_lens), device=device))
    mode = torch.tensor([ATTENTION_MODES.index(m) for m in attn_modes], device=device)[split]
    sample = torch.repeat_interleave(torch.arange(len(sample_lens), device=device), torch.tensor(list(sample_lens), device=device))
    pos = torch.arange(total, device=device)
    causal = pos[:, None] >= pos[None, :]
    same_split = split[:, None] == split[None, :]
    whole = same_split & (mode[:, None] != 0)
    foreign_noise = (mode[None, :] == 2) & ~same_split
    return (causal | whole) & ~foreign_noise & (sample[:, None] == sample[None, :])


def route(x: torch.Tensor, und: torch.Tensor, gen: torch.Tensor, und_fn, gen_fn, width: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Apply ``und_fn`` to the understanding rows of ``x`` and ``gen_fn`` to the generation rows."""
    out = x.new_zeros(x.shape[0], width)
    out[und] = und_fn(x[und])
    # called on no rows too: every rank's step then reaches both experts' parameters
    out[gen] = gen_fn(x[gen])
    return out


class MoTAttention(nn.Module):
    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        hidden, q_width, kv_width = config.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        for suffix in ("", "_moe_gen"):
            setattr(self, f"q_proj{suffix}", nn.Linear(hidden, q_width, bias=True))
            setattr(self, f"k_proj{suffix}", nn.Linear(hidden, kv_width, bias=True))
            setattr(self, f"v_proj{suffix}", nn.Linear(hidden, kv_width, bias=True))
            setattr(self, f"o_proj{suffix}", nn.Linear(q_width, hidden, bias=False))
            norm = (lambda: Qwen2RMSNorm(self.head_dim, eps=config.rms_norm_eps)) if config.qk_norm else nn.Identity
            setattr(self, f"q_norm{suffix}", norm())
            setattr(self, f"k_norm{suffix}", norm())

    def forward(self, x: torch.Tensor, und: torch.Tensor, gen: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        hd = self.head_dim
        q = route(x, und, gen, self.q_proj, self.q_proj_moe_gen, self.heads * hd).view(-1, self.heads, hd)
        k = route(x, und, gen, self.k_proj, self.k_proj_moe_gen, self.kv_heads * hd).view(-1, self.kv_heads, hd)
        v = route(x, und, gen, self.v_proj, self.v_proj_moe_gen, self.kv_heads * hd).view(-1, self.kv_heads, hd)
        q = route(q.flatten(1), und, gen, lambda t: self._norm(self.q_norm, t), lambda t: self._norm(self.q_norm_moe_gen, t), self.heads * hd).view_as(q)
        k = route(k.flatten(1), und, gen, lambda t: self._norm(self.k_norm, t), lambda t: self._norm(self.k_norm_moe_gen, t), self.kv_heads * hd).view_as(k)
        cos, sin = rope
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask, enable_gqa=True)
        out = out[0].transpose(0, 1).reshape(-1, self.heads * hd)
        return route(out, und, gen, self.o_proj, self.o_proj_moe_gen, x.shape[-1])

    def _norm(self, norm: nn.Module, flat: torch.Tensor) -> torch.Tensor:
        return norm(flat.view(flat.shape[0], flat.shape[1] // self.head_dim, self.head_dim)).flatten(1)


class MoTDecoderLayer(nn.Module):
    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.self_attn = MoTAttention(config)
        self.mlp = Qwen2MLP(config)
        self.mlp_moe_gen = Qwen2MLP(config)
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.input_layernorm_moe_gen = Qwen2RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm_moe_gen = Qwen2RMSNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, und: torch.Tensor, gen: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1]
        h = route(x, und, gen, self.input_layernorm, self.input_layernorm_moe_gen, width)
        x = x + self.self_attn(h, und, gen, rope, mask)
        mlp_und = lambda t: self.mlp(self.post_attention_layernorm(t))  # noqa: E731
        mlp_gen = lambda t: self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(t))  # noqa: E731
        return x + route(x, und, gen, mlp_und, mlp_gen, width)


class MoTModel(nn.Module):
    """``language_model.model``: embeddings, the MoT layers, the two final norms, 1-D RoPE."""

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, getattr(config, "pad_token_id", None))
        self.layers = nn.ModuleList(MoTDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_moe_gen = Qwen2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen2RotaryEmbedding(config=config)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, und: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary_emb(x, position_ids[None])
        rope = (cos[0], sin[0])
        for layer in self.layers:
            x = layer(x, und, gen, rope, mask)
        return route(x, und, gen, self.norm, self.norm_moe_gen, x.shape[-1])


class MoTForCausalLM(nn.Module):
    """``language_model``: the decoder and its (untied) text head."""

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.model = MoTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
