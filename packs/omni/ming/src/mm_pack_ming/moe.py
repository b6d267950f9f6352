"""The BailingMoe decoder (Ling-lite) of Ming-Lite-Omni, single-device code.

Parameter names are the release's under ``model.``: ``model.word_embeddings``,
``model.layers.N.attention.query_key_value`` (one fused projection: queries, then keys, then
values, by heads), ``model.layers.N.attention.dense``, ``model.layers.N.mlp.{gate, image_gate,
audio_gate}.weight`` (the per-modality routers of ``multi_gate``), ``model.layers.N.mlp.experts.E.
{gate,up,down}_proj``, ``model.layers.N.mlp.shared_experts.*``, ``model.norm``, ``lm_head``.

The maths is the reference's (``modeling_bailing_moe.py``):

- RMSNorm in float32, scaled by its weight in the input's dtype; plain RoPE (``rope_theta``,
  rotate-half) on positions that restart per packed sample.
- Routing: ``softmax(x W_gate^T)`` in float32, the top ``num_experts_per_tok`` experts, their
  weights renormalised to sum 1 (``norm_topk_prob``). With ``multi_gate`` an image token takes
  the ``image_gate``'s choice and weights, an audio token the ``audio_gate``'s, every other
  token the ``gate``'s. The reference marks the modalities by a start/end span per row
  (everything between a row's first and last image token); here each token carries its own
  modality, which is the same for a sample with one picture or one clip and does not route a
  row without pictures as a picture (the reference's span of a row without image tokens is the
  whole row when another row of its batch has one).
- Experts: a loop over all experts, each on the tokens that chose it (an expert no token chose
  runs on an empty batch, so every rank calls every expert's forward under FSDP2), its output
  scaled by the routing weight and added at its token. The shared experts (one MLP of width
  ``moe_intermediate_size * num_shared_experts``) run on every token and are added.
- ``norm_head``: the logits use ``lm_head.weight`` divided by its column norms (the L2 norm
  over the vocabulary of each hidden unit, plus 1e-7), the norms detached as the reference's
  training path does; the stored weight is left as it is.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

TEXT, IMAGE, AUDIO = 0, 1, 2


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, L, head_dim] of positions [B, L] (frequencies in float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class Attention(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = c.num_attention_heads, c.num_key_value_heads, c.head_dim, float(c.rope_theta)
        self.query_key_value = nn.Linear(c.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=c.use_qkv_bias)
        self.dense = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=c.use_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, cache: dict | None = None) -> torch.Tensor:  # type: ignore[type-arg]
        """``mask`` [B, queries, keys]; ``cache`` (generation) holds this layer's rotated keys
        and values so far, extended here."""
        b, n, _ = x.shape
        qkv = self.query_key_value(x).view(b, n, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        return self.dense(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, width: int, act: str) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)
        self.act = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    """A router: the top-k experts of each token and their (renormalised) weights."""

    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = c.num_experts_per_tok, c.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(c.num_experts, c.hidden_size))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = F.linear(x, self.weight).softmax(dim=-1, dtype=torch.float32)
        weight, index = torch.topk(scores, self.top_k, dim=-1)
        if self.top_k > 1 and self.norm_topk_prob:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        return index, weight


class SparseMoe(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.multi_gate = bool(c.multi_gate)
        self.experts = nn.ModuleList([MLP(c.hidden_size, c.moe_intermediate_size, c.hidden_act) for _ in range(c.num_experts)])
        if self.multi_gate:
            self.image_gate = Gate(c)
            self.audio_gate = Gate(c)
        self.gate = Gate(c)
        self.shared_experts = MLP(c.hidden_size, c.moe_intermediate_size * c.num_shared_experts, c.hidden_act) if c.num_shared_experts is not None else None

    def route(self, x: torch.Tensor, modality: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index, weight = self.gate(x)
        if self.multi_gate:
            for gate, kind in ((self.image_gate, IMAGE), (self.audio_gate, AUDIO)):
                chosen = (modality == kind)[:, None]
                other_index, other_weight = gate(x)
                index = torch.where(chosen, other_index, index)
                weight = torch.where(chosen, other_weight, weight)
        return index, weight

    def forward(self, hidden: torch.Tensor, modality: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        index, weight = self.route(x, modality.reshape(-1))
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (index == e).nonzero(as_tuple=True)
            y = expert(x[token]) * weight[token, slot, None].to(x.dtype)
            out = out.index_add(0, token, y)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out.view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, c: SimpleNamespace, index: int) -> None:
        super().__init__()
        self.attention = Attention(c)
        moe = c.num_experts is not None and index >= c.first_k_dense_replace
        self.mlp = SparseMoe(c) if moe else MLP(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, modality: torch.Tensor, cache: dict | None = None) -> torch.Tensor:  # type: ignore[type-arg]
        x = x + self.attention(self.input_layernorm(x), cos, sin, mask, cache)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, modality) if isinstance(self.mlp, SparseMoe) else self.mlp(h))


class BailingMoeModel(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.config = c
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(c, i) for i in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, modality: torch.Tensor, cache: list | None = None) -> torch.Tensor:  # type: ignore[type-arg]
        """``cache``: one dict per layer (generation's keys and values), or None."""
        cos, sin = rope(positions, self.config.head_dim, float(self.config.rope_theta))
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, modality, None if cache is None else cache[i])
        return self.norm(x)


class BailingMoeForCausalLM(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.config = c
        self.model = BailingMoeModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def head_weight(self) -> torch.Tensor:
        w = self.lm_head.weight
        if not self.config.norm_head:
            return w
        return w / (torch.norm(w.float(), p=2, dim=0, keepdim=True) + 1e-7).detach().to(w.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head_weight()).float()


def sample_mask(segments: torch.Tensor) -> torch.Tensor:
    """Boolean [B, L, L]: causal, within one packed sample (``segments`` [B, L]: the sample's
    number from 1, 0 for padding); a padding row sees itself so its softmax stays finite."""
    n = segments.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    return (causal & same & (segments[:, None, :] > 0)) | torch.eye(n, dtype=torch.bool, device=segments.device)
