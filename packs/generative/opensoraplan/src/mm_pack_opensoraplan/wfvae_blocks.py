"""The WF-VAE's building blocks (Open-Sora Plan v1.5's video VAE; :mod:`mm_pack_opensoraplan.wfvae`
assembles them), written from the public reference (PKU-YuanGroup/WF-VAE,
``causalvideovae/model/modules``). Attribute names are the reference's, so the state dict's keys
are the released ``checkpoint.ckpt``'s (``conv.weight`` inside a causal convolution, ``norm.weight``
inside a layer norm, the Haar filters as ``h_conv.conv.weight`` ... or buffers ``h``, ``g`` ...).

Causality is in time only: a 3-D convolution of temporal kernel k sees k - 1 copies of the first
frame before it (no zero padding), so frame 0 is encoded on its own (an image is a 1-frame clip).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: the Haar filters of a 2x2x2 block (time, row, column), in the reference's order (low-low-low
#: first): the index's bits say high-pass in column (1), row (2), time (4); 0.3536 ~ 1/sqrt(8) as
#: the reference rounds it (the released weights were trained with the rounded filters)
HAAR_3D = ("h", "g", "hh", "gh", "h_v", "g_v", "hh_v", "gh_v")


def haar_filters() -> torch.Tensor:
    """[8, 1, 2, 2, 2] in :data:`HAAR_3D`'s order."""
    low, high = torch.tensor([1.0, 1.0]), torch.tensor([1.0, -1.0])
    out = []
    for i in range(8):
        t, r, c = (high if i & 4 else low), (high if i & 2 else low), (high if i & 1 else low)
        out.append(torch.einsum("i,j,k->ijk", t, r, c) * 0.3536)
    return torch.stack(out)[:, None]


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)  # the reference's spelling: F.silu may round differently


def per_frame(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A 2-D module on every frame of [B, C, T, H, W] (and on [B, C, H, W] as it is)."""
    if x.dim() == 4:
        return module(x)
    b, _, t = x.shape[:3]
    y = module(x.transpose(1, 2).flatten(0, 1))
    return y.unflatten(0, (b, t)).transpose(1, 2)


class FrameConv2d(nn.Conv2d):
    """A 2-D convolution applied frame by frame (the reference's ``Conv2d``: keys ``weight``, ``bias``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return per_frame(super().forward, x)  # type: ignore[arg-type]


class Streaming:
    """Chunked causal time: with ``streaming`` set, a clip comes in chunks of frames in order, and
    the frames of the (padded) sequence that no output window has used up yet wait in ``tail``
    for the next chunk; the first chunk alone is padded. The outputs are the whole clip's."""

    streaming = False
    tail: torch.Tensor | None = None
    started = False  # a chunk went through (the first one alone is padded or trimmed)
    final = False  # the clip's last chunk: nothing is held back for a next one

    def stream(self, on: bool) -> None:
        self.streaming, self.tail, self.started, self.final = on, None, False, False

    def causal(self, x: torch.Tensor, pad: int, kernel: int, stride: int) -> torch.Tensor:
        if self.streaming and self.tail is not None:
            x = torch.cat([self.tail, x], dim=2)
        elif pad:
            x = torch.cat([x[:, :, :1].expand(-1, -1, pad, -1, -1), x], dim=2)
        if self.streaming:
            used = ((x.shape[2] - kernel) // stride + 1) * stride  # where the next window starts
            self.tail = x[:, :, used:]
        return x


class CausalConv3d(Streaming, nn.Module):
    """A 3-D convolution padded in time by repeating the first frame (kernel_t - 1 times)."""

    def __init__(self, chan_in: int, chan_out: int, kernel_size: int, stride: int = 1, padding: int = 0, bias: bool = True) -> None:
        super().__init__()
        self.time_pad = kernel_size - 1
        self.conv = nn.Conv3d(chan_in, chan_out, kernel_size, stride=stride, padding=(0, padding, padding), bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.causal(x, self.time_pad, self.time_pad + 1, self.conv.stride[0]))


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis of [B, C, ...] (the reference's ``LayerNorm``: key ``norm``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.movedim(1, -1)).movedim(-1, 1)


def normalize(channels: int, norm_type: str) -> nn.Module:
    if norm_type in ("layernorm", "aelayernorm"):  # MindSpeed-MM's v1.5 config calls this one "aelayernorm"
        return ChannelLayerNorm(channels)
    if norm_type == "groupnorm":
        return nn.GroupNorm(32, channels, eps=1e-6)
    raise ValueError(f"WF-VAE config: norm_type {norm_type!r} is not 'layernorm' (or 'aelayernorm') or 'groupnorm'")


class ResnetBlock2D(nn.Module):
    """norm, SiLU, conv, norm, SiLU, dropout, conv, plus a 1x1 shortcut where the width changes; frame by frame."""

    def __init__(self, in_channels: int, out_channels: int, norm_type: str, dropout: float) -> None:
        super().__init__()
        self.norm1 = normalize(in_channels, norm_type)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = normalize(out_channels, norm_type)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def _frames(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(silu(self.norm1(x)))
        h = self.conv2(self.dropout(silu(self.norm2(h))))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return per_frame(self._frames, x)  # type: ignore[arg-type]


class ResnetBlock3D(nn.Module):
    """:class:`ResnetBlock2D` with causal 3-D convolutions."""

    def __init__(self, in_channels: int, out_channels: int, norm_type: str, dropout: float) -> None:
        super().__init__()
        self.norm1 = normalize(in_channels, norm_type)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3, padding=1)
        self.norm2 = normalize(out_channels, norm_type)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = CausalConv3d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(silu(self.norm1(x)))
        h = self.conv2(self.dropout(silu(self.norm2(h))))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock3DFix(nn.Module):
    """Single-head attention among the positions of each frame (1x1x1 projections), residual."""

    def __init__(self, channels: int, norm_type: str) -> None:
        super().__init__()
        self.norm = normalize(channels, norm_type)
        self.q, self.k, self.v = (CausalConv3d(channels, channels, 1) for _ in range(3))
        self.proj_out = CausalConv3d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c, t, hh, ww = x.shape

        def tokens(y: torch.Tensor) -> torch.Tensor:
            return y.permute(0, 2, 3, 4, 1).reshape(b * t, hh * ww, c)

        out = F.scaled_dot_product_attention(tokens(self.q(h)), tokens(self.k(h)), tokens(self.v(h)))
        return x + self.proj_out(out.reshape(b, t, hh, ww, c).permute(0, 4, 1, 2, 3))


class Spatial2xTime2x3DDownsample(nn.Module):
    """Stride-2 causal 3x3x3 convolution; rows and columns zero-padded by one at their end."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = CausalConv3d(in_channels, out_channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Spatial2xTime2x3DUpsample(Streaming, nn.Module):
    """T -> 2T - 1 frames (the first frame stays one frame), 2x rows and columns, then a causal 3x3x3 convolution.

    Time interpolation (of frames 1..T-1) looks one frame ahead: streaming, the last output of a
    chunk waits for the next chunk's first frame (``tail`` keeps the frame it needs), and is the
    clamped end only in the ``final`` chunk."""

    def __init__(self, in_channels: int, out_channels: int, t_interpolation: str) -> None:
        super().__init__()
        self.t_interpolation = t_interpolation
        self.conv = CausalConv3d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def space(y: torch.Tensor) -> torch.Tensor:
            return F.interpolate(y, scale_factor=(1, 2, 2), mode="trilinear")

        parts = []
        if not (self.streaming and self.started):
            parts.append(space(x[:, :, :1]))
            x = x[:, :, 1:]
        held = self.tail if self.streaming else None
        if x.shape[2]:
            window = x if held is None else torch.cat([held, x], dim=2)
            out = F.interpolate(window, scale_factor=(2, 1, 1), mode=self.t_interpolation)
            # a window's first output is clamped where a frame came before it: that one went out with the last chunk
            out = out[:, :, (0 if held is None else 1) : (None if not self.streaming or self.final else -1)]
            parts.append(space(out))
            if self.streaming:
                self.tail = window[:, :, -1:]
        self.started = True
        return self.conv(torch.cat(parts, dim=2))


class HaarWaveletTransform3D(Streaming, nn.Module):
    """[B, C, T, H, W] -> [B, 8C, (T+1)/2, H/2, W/2]: the 8 Haar sub-bands (band-major: channel
    ``band * C + c``) of 2x2x2 blocks, the first frame repeated once before the clip (causal).
    The filters are the reference's frozen parameters (``h_conv.conv.weight`` ...)."""

    def __init__(self) -> None:
        super().__init__()
        for name in HAAR_3D:
            setattr(self, f"{name}_conv", CausalConv3d(1, 1, 2, stride=2, bias=False))
        with torch.no_grad():
            for name, f in zip(HAAR_3D, haar_filters()):
                getattr(self, f"{name}_conv").conv.weight.copy_(f[None])
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        weight = torch.cat([getattr(self, f"{n}_conv").conv.weight for n in HAAR_3D])
        x = self.causal(x.reshape(b * c, 1, *x.shape[2:]), 1, 2, 2)
        y = F.conv3d(x, weight.to(x.dtype), stride=2)  # [(B C), 8, T', H', W']
        return y.unflatten(0, (b, c)).transpose(1, 2).flatten(1, 2)


class InverseHaarWaveletTransform3D(Streaming, nn.Module):
    """The inverse of :class:`HaarWaveletTransform3D`: [B, 8C, T, H, W] -> [B, C, 2T - 1, 2H, 2W]
    (the repeated first frame dropped). The filters are buffers (``h``, ``g`` ...), as the reference's."""

    def __init__(self) -> None:
        super().__init__()
        for name, f in zip(HAAR_3D, haar_filters()):
            self.register_buffer(name, f[None].clone())

    def forward(self, coeffs: torch.Tensor) -> torch.Tensor:
        b, c8 = coeffs.shape[:2]
        c = c8 // 8
        weight = torch.cat([getattr(self, n) for n in HAAR_3D])  # [8 bands in, 1 out, 2, 2, 2]
        x = coeffs.unflatten(1, (8, c)).transpose(1, 2).flatten(0, 1)  # [(B C), 8, T, H, W]
        y = F.conv_transpose3d(x, weight.to(x.dtype), stride=2)
        if not (self.streaming and self.started):  # the first frame's repeat, as the encoder padded it
            y = y[:, :, 1:]
        self.started = True
        return y.reshape(b, c, *y.shape[2:])
