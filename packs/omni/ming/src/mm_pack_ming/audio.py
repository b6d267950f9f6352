"""The SAN-M audio encoder (FunASR's ``SANMEncoder`` as Ming-Lite-Omni builds it) and the
audio projector, single-device code under the release's names.

Why not transformers' ``FunAsrNanoEncoder``: its blocks are the same maths, but it splits
the attention's fused ``linear_q_k_v`` into ``q_proj``/``k_proj``/``v_proj`` and names every
tensor differently; the release stores FunASR's names (``audio.encoders0.0.self_attn.
linear_q_k_v.weight``, ``audio.encoders.N.self_attn.fsmn_block.weight``, ``audio.encoders.N.
feed_forward.w_1``, ``audio.after_norm``), which this module keeps as they are.

The encoder, with ``input_layer: pe`` and ``normalize_before``: LFR features [B, T, 560] are
scaled by ``sqrt(output_size)``, plus sinusoidal positions counted from 1; ``encoders0`` (one
block from 560 to ``output_size``, no residual around its attention, as the widths differ) and
``encoders`` (``num_blocks - 1`` blocks); ``after_norm``. A block: LayerNorm, multi-head
attention over the unpadded frames plus the FSMN memory (a depthwise convolution of kernel
``kernel_size`` over the values, zero at padded frames, plus those values), LayerNorm, a ReLU
feed-forward, each with its residual.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


def positions(length: int, depth: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """FunASR's ``SinusoidalPositionEncoder``: positions 1..length, sin then cos halves."""
    step = math.log(10000.0) / (depth / 2 - 1)
    inv = torch.exp(torch.arange(depth / 2, device=device).float() * -step)
    t = torch.arange(1, length + 1, device=device).float()[:, None] * inv[None]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1).to(dtype)


class SanmAttention(nn.Module):
    def __init__(self, heads: int, size_in: int, size: int, kernel: int, shift: int) -> None:
        super().__init__()
        self.heads, self.d_k = heads, size // heads
        self.linear_q_k_v = nn.Linear(size_in, size * 3)
        self.linear_out = nn.Linear(size, size)
        self.fsmn_block = nn.Conv1d(size, size, kernel, stride=1, padding=0, groups=size, bias=False)
        left = (kernel - 1) // 2 + (shift if shift > 0 else 0)
        self.pad = (left, kernel - 1 - left)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.linear_q_k_v(x).chunk(3, dim=-1)
        keep = valid[:, :, None].to(x.dtype)
        values = v * keep
        memory = self.fsmn_block(F.pad(values.transpose(1, 2), self.pad)).transpose(1, 2)
        memory = (memory + values) * keep
        q, k, v = (z.view(b, t, self.heads, self.d_k).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q * self.d_k**-0.5, k.transpose(-2, -1))
        pad = ~valid[:, None, None, :]
        weights = scores.masked_fill(pad, float("-inf")).softmax(dim=-1).masked_fill(pad, 0.0)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, -1)
        return self.linear_out(out) + memory


class FeedForward(nn.Module):
    def __init__(self, size: int, units: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(size, units)
        self.w_2 = nn.Linear(units, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.relu(self.w_1(x)))


class SanmBlock(nn.Module):
    def __init__(self, c: SimpleNamespace, size_in: int) -> None:
        super().__init__()
        self.self_attn = SanmAttention(c.attention_heads, size_in, c.output_size, c.kernel_size, c.sanm_shfit)
        self.feed_forward = FeedForward(c.output_size, c.linear_units)
        self.norm1 = nn.LayerNorm(size_in, eps=1e-12)
        self.norm2 = nn.LayerNorm(c.output_size, eps=1e-12)
        self.residual = size_in == c.output_size

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        attended = self.self_attn(self.norm1(x), valid)
        x = x + attended if self.residual else attended
        return x + self.feed_forward(self.norm2(x))


class SanmEncoder(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.size = c.output_size
        self.encoders0 = nn.ModuleList([SanmBlock(c, c.input_size)])
        self.encoders = nn.ModuleList([SanmBlock(c, c.output_size) for _ in range(c.num_blocks - 1)])
        self.after_norm = nn.LayerNorm(c.output_size, eps=1e-12)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """LFR features [B, T, input_size] and their lengths -> [B, T, output_size] (rows past a
        clip's length are padding)."""
        valid = torch.arange(feats.shape[1], device=feats.device)[None] < lengths[:, None]
        x = feats * self.size**0.5
        x = x + positions(x.shape[1], x.shape[2], x.device, x.dtype)[None]
        for block in [*self.encoders0, *self.encoders]:
            x = block(x, valid)
        return self.after_norm(x)


class Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2)


def audio_projector(c: SimpleNamespace, hidden: int, depth: int) -> nn.Sequential:
    """``linear_proj_audio``: Conv1d(encoder width -> hidden) over time, then (depth - 1) x
    (GELU, Linear), in the reference's Sequential order (so its indices are the release's)."""
    conv = nn.Conv1d(c.audio_encoder_output_size, hidden, kernel_size=c.ds_kernel_size, stride=c.ds_stride, padding=c.ds_kernel_size // 2)
    parts: list[nn.Module] = [conv, Transpose()]
    for _ in range(1, depth):
        parts += [nn.GELU(), nn.Linear(hidden, hidden)]
    parts.append(Transpose())
    return nn.Sequential(*parts)


def projected_length(lengths: torch.Tensor, c: SimpleNamespace) -> torch.Tensor:
    """Frames after the projector's strided convolution."""
    k, s = c.ds_kernel_size, c.ds_stride
    return (lengths + 2 * (k // 2) - k) // s + 1
