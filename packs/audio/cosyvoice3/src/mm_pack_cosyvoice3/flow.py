"""The CosyVoice3 acoustic model: speech tokens -> mel by conditional flow matching with a DiT.

``CausalMaskedDiffWithDiT`` in the public code; parameter names equal the public ``flow.pt``
keys (``input_embedding``, ``spk_embed_affine_layer``, ``pre_lookahead_layer.conv1/conv2``,
``decoder.estimator.*`` with ``decoder.estimator.rotary_embed.inv_freq`` a stored buffer, as
x-transformers' RotaryEmbedding registers it).

Two quirks kept on purpose, because the released weights were trained with them: the rotary
embedding is applied to the projected queries/keys *before* the heads are split, so only the
first ``dim_head`` channels (the first head) rotate, in interleaved pairs; and inference starts
from a fixed noise tensor (``torch.manual_seed(0); torch.randn(1, 80, 15000)``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mm_pack_cosyvoice3.config import FlowConfig

_NOISE: dict[str, torch.Tensor] = {}


def fixed_noise(channels: int, frames: int) -> torch.Tensor:
    """CausalConditionalCFM's inference noise: seed 0, shape [1, 80, 50 * 300], sliced."""
    if frames > 15000:
        raise ValueError(f"{frames} mel frames: CosyVoice3's fixed noise covers 15000 (300 s)")
    if "noise" not in _NOISE:
        _NOISE["noise"] = torch.randn(1, 80, 15000, generator=torch.Generator().manual_seed(0))
    return _NOISE["noise"][:, :channels, :frames]


class PreLookaheadLayer(nn.Module):
    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        x = F.pad(inputs.transpose(1, 2), (0, self.pre_lookahead_len))
        x = F.leaky_relu(self.conv1(x))
        x = self.conv2(F.pad(x, (self.conv2.kernel_size[0] - 1, 0)))
        return x.transpose(1, 2) + inputs


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, seq_len: int) -> torch.Tensor:
        t = torch.arange(seq_len, device=self.inv_freq.device).type_as(self.inv_freq)
        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)[None]  # (1, n, dim), pairs interleaved


def apply_rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    rot = freqs.shape[-1]
    head, rest = t[..., :rot], t[..., rot:]
    pairs = head.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    head = head * freqs.cos() + rotated * freqs.sin()
    return torch.cat((head, rest), dim=-1).type(t.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads, inner = heads, heads * dim_head
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = apply_rotary(self.to_q(x), rope), apply_rotary(self.to_k(x), rope), self.to_v(x)
        q, k, v = (y.view(b, -1, self.heads, y.shape[-1] // self.heads).transpose(1, 2) for y in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = self.to_out[0](out.transpose(1, 2).reshape(b, -1, q.shape[1] * q.shape[-1]))
        return out.masked_fill(~mask[:, 0, -1].unsqueeze(-1), 0.0)


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int, chunks: int = 6) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * chunks)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.chunk(self.linear(F.silu(emb)), self.linear.out_features // self.norm.normalized_shape[0], dim=1)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Dropout(0.0), nn.Linear(inner, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(t)
        norm = self.attn_norm.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        x = x + gate_msa[:, None] * self.attn(norm, mask, rope)
        norm = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp[:, None] * self.ff(norm)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
        emb = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
        return self.time_mlp(torch.cat((emb.sin(), emb.cos()), dim=-1).to(t.dtype))


class CausalConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0)))
        return self.conv2(F.pad(x, (self.kernel_size - 1, 0))).transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, mu_dim: int, out_dim: int, spk_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(out_dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat([x, cond, mu, spks[:, None].expand(-1, x.shape[1], -1)], dim=-1))
        return self.conv_pos_embed(x) + x


def chunk_attention_mask(mask: torch.Tensor, chunk: int) -> torch.Tensor:
    """(B, 1, T) padding mask -> (B, 1, T, T): full context, or each chunk sees itself and the past."""
    n = mask.shape[-1]
    mask = mask.bool()
    if chunk > 0:
        i = torch.arange(n, device=mask.device)
        full = mask & (i[None, :] < ((i[:, None] // chunk) + 1) * chunk)[None]
    else:
        full = mask.expand(-1, n, -1)
    full = full.clone()
    full[full.sum(-1) == 0] = True  # rows with nothing visible (padding) attend everywhere, then get masked
    return full[:, None]


class DiT(nn.Module):
    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_embed = TimestepEmbedding(cfg.dim)
        self.input_embed = InputEmbedding(cfg.mel_dim, cfg.mu_dim, cfg.dim, cfg.spk_dim)
        self.rotary_embed = RotaryEmbedding(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList([DiTBlock(cfg.dim, cfg.heads, cfg.dim_head, cfg.ff_mult) for _ in range(cfg.depth)])
        self.norm_out = AdaLayerNormZero(cfg.dim, chunks=2)
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)

    def forward(self, x, mask, mu, t, spks, cond, streaming: bool = False) -> torch.Tensor:  # type: ignore[no-untyped-def]
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        if t.ndim == 0:
            t = t.repeat(x.shape[0])
        t = self.time_embed(t)
        x = self.input_embed(x, cond, mu, spks)
        rope = self.rotary_embed(x.shape[1])
        attn_mask = chunk_attention_mask(mask, self.cfg.static_chunk_size if streaming else 0)
        for block in self.transformer_blocks:
            x = block(x, t, attn_mask, rope)
        scale, shift = self.norm_out(t)
        x = self.norm_out.norm(x) * (1 + scale)[:, None] + shift[:, None]
        return self.proj_out(x).transpose(1, 2)


class CausalConditionalCFM(nn.Module):
    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.estimator = DiT(cfg)

    def t_span(self, steps: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        span = torch.linspace(0, 1, steps + 1, device=device, dtype=dtype)
        return 1 - torch.cos(span * 0.5 * torch.pi) if self.cfg.t_scheduler == "cosine" else span

    @torch.inference_mode()
    def forward(self, mu, mask, spks, cond, n_timesteps: int = 10, streaming: bool = False, noise=None, cfg_rate: float | None = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
        """Euler ODE solve from noise with classifier-free guidance (the unconditional half has
        mu, speaker and prompt zeroed; ``cfg_rate`` None: the yaml's ``inference_cfg_rate``); (B, 80, T) mel."""
        x = (noise if noise is not None else fixed_noise(mu.shape[1], mu.shape[2])).to(mu)
        span = self.t_span(n_timesteps, mu.dtype, mu.device)
        t, dt = span[0:1], span[1] - span[0]
        rate = self.cfg.inference_cfg_rate if cfg_rate is None else cfg_rate
        zeros = torch.zeros_like
        for step in range(1, len(span)):
            both = self.estimator(
                torch.cat([x, x]), torch.cat([mask, mask]), torch.cat([mu, zeros(mu)]), t.expand(2 * x.shape[0]), torch.cat([spks, zeros(spks)]), torch.cat([cond, zeros(cond)]), streaming
            )
            d, d_cfg = both.chunk(2)
            x = x + dt * ((1.0 + rate) * d - rate * d_cfg)
            t = t + dt
            if step < len(span) - 1:
                dt = span[step + 1] - t
        return x.float()

    def compute_loss(self, x1, mask, mu, spks, cond, generator: torch.Generator | None = None, streaming: bool = False) -> torch.Tensor:  # type: ignore[no-untyped-def]
        """Conditional flow matching: predict x1 - (1 - sigma_min) z at a random point of the path."""
        b = mu.shape[0]
        t = torch.rand(b, 1, 1, generator=generator).to(mu)
        z = torch.randn(x1.shape, generator=generator).to(x1)
        sigma = self.cfg.sigma_min
        y = (1 - (1 - sigma) * t) * z + t * x1
        u = x1 - (1 - sigma) * z
        if self.cfg.training_cfg_rate > 0:
            keep = (torch.rand(b, generator=generator) > self.cfg.training_cfg_rate).to(mu)
            mu, spks, cond = mu * keep.view(-1, 1, 1), spks * keep.view(-1, 1), cond * keep.view(-1, 1, 1)
        pred = self.estimator(y, mask, mu, t.squeeze(), spks, cond, streaming)
        return F.mse_loss(pred * mask, u * mask, reduction="sum") / (mask.sum() * u.shape[1])


class CausalMaskedDiffWithDiT(nn.Module):
    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.pre_lookahead_layer = PreLookaheadLayer(cfg.input_size, cfg.pre_lookahead_channels, cfg.pre_lookahead_len)
        self.decoder = CausalConditionalCFM(cfg)

    def encode(self, token: torch.Tensor, token_len: torch.Tensor, embedding: torch.Tensor):  # type: ignore[no-untyped-def]
        spks = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        mask = (torch.arange(token.shape[1], device=token.device)[None] < token_len[:, None]).unsqueeze(-1).to(spks)
        h = self.pre_lookahead_layer(self.input_embedding(token.clamp(min=0)) * mask)
        ratio = self.cfg.token_mel_ratio
        return h.repeat_interleave(ratio, dim=1), mask.repeat_interleave(ratio, dim=1).squeeze(-1), spks

    def forward(self, token, token_len, feat, feat_len, embedding, generator: torch.Generator | None = None, streaming: bool = False) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
        """The CFM loss on a batch (``feat``: B x T_mel x 80, T_mel = token_mel_ratio x tokens);
        half the utterances get a random prefix (up to 30 %) of their own mel as the prompt."""
        h, mask, spks = self.encode(token, token_len, embedding)
        conds = torch.zeros_like(feat)
        for i, n in enumerate(feat_len.tolist()):
            if torch.rand(1, generator=generator).item() < 0.5:
                continue
            index = int(torch.randint(0, int(0.3 * n) + 1, (1,), generator=generator))
            conds[i, :index] = feat[i, :index]
        loss = self.decoder.compute_loss(feat.transpose(1, 2), mask.unsqueeze(1), h.transpose(1, 2), spks, conds.transpose(1, 2), generator, streaming)
        return {"loss": loss}

    @torch.inference_mode()
    def inference(self, token, prompt_token, prompt_feat, embedding, n_timesteps: int = 10, streaming: bool = False, noise=None, cfg_rate: float | None = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
        """Mel (1 x 80 x T) for ``token`` (1 x N), continuing ``prompt_feat`` (1 x T_p x 80)."""
        token = torch.cat([prompt_token, token], dim=1)
        h, _, spks = self.encode(token, torch.tensor([token.shape[1]], device=token.device), embedding)
        n_prompt = prompt_feat.shape[1]
        conds = torch.zeros(1, h.shape[1], self.cfg.output_size, device=h.device, dtype=h.dtype)
        conds[:, :n_prompt] = prompt_feat
        mask = torch.ones(1, 1, h.shape[1], device=h.device, dtype=h.dtype)
        feat = self.decoder(h.transpose(1, 2).contiguous(), mask, spks, conds.transpose(1, 2), n_timesteps, streaming, noise, cfg_rate)
        return feat[:, :, n_prompt:].float()
