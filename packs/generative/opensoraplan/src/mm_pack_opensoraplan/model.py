"""Open-Sora Plan v1.5's denoiser, the sparse U-shaped MMDiT ("SUV"), single-device.

Written from the public description and reference code (MindSpeed-MM ``SparseUMMDiT``): the
config fields are the reference's (``num_layers`` and ``sparse_n`` per stage, ``double_ff``,
``sparse1d``, ``skip_connection`` ...), the parameter names those of the released
``model_ema.pt`` (``transformer_blocks.<stage>.<block>.attn1.to_q``, ``add_q_proj``,
``norm_added_q``, ``to_add_out``, ``ff_enc`` ...), so the public weights load strictly.

The layout: stages of MMDiT blocks (video and text tokens in one joint attention, separate
AdaLN-zero modulation of each), the first half's outputs skip-connected into the second half's
inputs (U shape); within a stage of ``sparse_n`` k > 1 every block attends sparsely: the video
tokens split into k interleaved groups (token i in group i mod k, or in the "group" blocks,
every other one, (i // k) mod k), each group attending to itself and the text; the text sees
every group and averages the k results. :func:`sparse_1d` and :func:`unsparse_1d` are that
rearrangement; tests check it against its dense-mask definition.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FP32LayerNorm(nn.Module):
    """Layer norm computed in float32 with weight and bias (the reference's ``fp32_layer_norm``)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.weight.shape, self.weight.float(), self.bias.float(), self.eps).to(x.dtype)


class RMSNorm(nn.Module):
    """RMS norm in float32, cast back, then scaled (Megatron's, the reference's ``rms_norm``)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def make_norm(norm_cls: str, dim: int, eps: float) -> nn.Module:
    if norm_cls == "fp32_layer_norm":
        return FP32LayerNorm(dim, eps)
    if norm_cls == "rms_norm":
        return RMSNorm(dim, eps)
    raise ValueError(f"norm_cls={norm_cls!r}: Open-Sora Plan has fp32_layer_norm or rms_norm")


def clamp_fp16(x: torch.Tensor, training: bool) -> torch.Tensor:
    """The reference's guard in half-precision inference: infinities and overflow clamped."""
    if not training and x.dtype == torch.float16:
        x = x.nan_to_num(posinf=65504.0, neginf=-65504.0).clamp(-65504.0, 65504.0)
    return x


class FeedForward(nn.Module):
    """``net.0.proj`` (in, GELU) then ``net.2`` (out), no biases (the reference's ``ff_bias``)."""

    def __init__(self, dim: int, activation_fn: str) -> None:
        super().__init__()
        if activation_fn not in ("gelu", "gelu-approximate"):
            raise ValueError(f"activation_fn={activation_fn!r}: this pack implements gelu and gelu-approximate")
        self.approximate = "tanh" if activation_fn == "gelu-approximate" else "none"
        proj = nn.Module()
        proj.proj = nn.Linear(dim, 4 * dim, bias=False)
        self.net = nn.ModuleList([proj, nn.Identity(), nn.Linear(4 * dim, dim, bias=False)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](F.gelu(self.net[0].proj(x), approximate=self.approximate))


class NormZero(nn.Module):
    """AdaLN-zero of both streams: shift, scale, gate of the video and of the text from the conditioning."""

    def __init__(self, cond_dim: int, dim: int, eps: float, norm_cls: str, with_text: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(cond_dim, 6 * dim)
        self.norm = make_norm(norm_cls, dim, eps)
        self.norm_enc = make_norm(norm_cls, dim, eps) if with_text else None

    def forward(self, x: torch.Tensor, text: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shift, scale, gate, t_shift, t_scale, t_gate = self.linear(F.silu(temb).to(self.linear.weight.dtype)).float().chunk(6, dim=1)
        x = (self.norm(x).float() * (1 + scale[:, None]) + shift[:, None]).to(x.dtype)
        if self.norm_enc is not None:
            text = (self.norm_enc(text).float() * (1 + t_scale[:, None]) + t_shift[:, None]).to(text.dtype)
        return x, text, gate[:, None], t_gate[:, None]


def sparse_1d(x: torch.Tensor, k: int, group: bool) -> torch.Tensor:
    """[B, S, D] video tokens -> [k B, S' / k, D]: batch row j B + b holds group j of sample b
    (S padded with zeros to S' = a multiple of k^2)."""
    b, s, d = x.shape
    x = F.pad(x, (0, 0, 0, (-s) % (k * k)))
    if not group:  # token i -> group i mod k
        return x.view(b, -1, k, d).permute(2, 0, 1, 3).reshape(k * b, -1, d)
    x = x.view(b, -1, k, k, d)  # token (n, m, j): group m = (i // k) mod k
    return x.permute(2, 0, 1, 3, 4).reshape(k * b, -1, d)


def unsparse_1d(x: torch.Tensor, k: int, group: bool, length: int) -> torch.Tensor:
    """The inverse of :func:`sparse_1d`, the padding cut off."""
    kb, g, d = x.shape
    b = kb // k
    if not group:
        x = x.view(k, b, g, d).permute(1, 2, 0, 3)
    else:
        x = x.view(k, b, g // k, k, d).permute(1, 2, 0, 3, 4)
    return x.reshape(b, -1, d)[:, :length]


def rope_tables(dim: int, positions: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=positions.device).float() / dim))
    freqs = torch.outer(positions.float() / scale, inv_freq)
    freqs = torch.cat([freqs, freqs], dim=-1)
    return freqs.cos()[None, :, None], freqs.sin()[None, :, None]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class SparseMMAttention(nn.Module):
    """Joint attention of video and text tokens: RMS-normed queries and keys, 3D RoPE on the video's."""

    def __init__(self, dim: int, heads: int, head_dim: int, bias: bool, eps: float, context_pre_only: bool, sparse_n: int, sparse_group: bool) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim, self.sparse_n, self.sparse_group = heads, head_dim, sparse_n, sparse_group
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, inner, bias=bias) for _ in range(3))
        self.add_q_proj, self.add_k_proj, self.add_v_proj = (nn.Linear(dim, inner, bias=bias) for _ in range(3))
        self.norm_q, self.norm_k = RMSNorm(head_dim, eps), RMSNorm(head_dim, eps)
        self.norm_added_q, self.norm_added_k = RMSNorm(head_dim, eps), RMSNorm(head_dim, eps)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])
        self.to_add_out = None if context_pre_only else nn.Linear(inner, dim)

    def heads_of(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], self.heads, self.head_dim)

    def apply_rope(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...]) -> torch.Tensor:
        d_t, d = self.head_dim // 16 * 4, self.head_dim // 16 * 6
        t, y, w = torch.split(x, [d_t, d, d], dim=-1)
        parts = [rotate(t, *rope[0:2]), rotate(y, *rope[2:4]), rotate(w, *rope[4:6])]
        return torch.cat(parts, dim=-1).to(x.dtype)

    def forward(self, x: torch.Tensor, text: torch.Tensor, keep: torch.Tensor, rope: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """``keep``: [k B, 1, 1, keys] True where a key is attended (its video group's and the text's)."""
        b, s, _ = x.shape
        q = self.apply_rope(self.norm_q(self.heads_of(self.to_q(x))), rope).flatten(2)
        k = self.apply_rope(self.norm_k(self.heads_of(self.to_k(x))), rope).flatten(2)
        v = self.to_v(x)
        tq = self.norm_added_q(self.heads_of(self.add_q_proj(text))).flatten(2)
        tk = self.norm_added_k(self.heads_of(self.add_k_proj(text))).flatten(2)
        tv = self.add_v_proj(text)
        n = self.sparse_n
        if n > 1:
            q, k, v = (sparse_1d(t, n, self.sparse_group) for t in (q, k, v))
            tq, tk, tv = (t.repeat(n, 1, 1) for t in (tq, tk, tv))
        video_len = q.shape[1]
        q, k, v = (torch.cat(pair, dim=1).unflatten(2, (self.heads, self.head_dim)).transpose(1, 2) for pair in ((q, tq), (k, tk), (v, tv)))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=self.head_dim**-0.5).transpose(1, 2).flatten(2).to(x.dtype)
        x_out, t_out = out[:, :video_len], out[:, video_len:]
        if n > 1:
            x_out = unsparse_1d(x_out, n, self.sparse_group, s)
            t_out = t_out.view(n, b, *t_out.shape[1:]).mean(0)
        x_out = self.to_out[1](self.to_out[0](x_out))
        return x_out, (self.to_add_out(t_out) if self.to_add_out is not None else t_out)
