"""The layers of Step-Video's Video-VAE (:mod:`mm_pack_stepvideo.stepvae`), channel-first
([B, C, T, H, W]) single-device torch code.

The reference (stepfun-ai/Step-Video-T2V ``stepvideo/vae/vae.py``) runs most layers on
channel-last copies and has three causal-convolution classes (``CausalConv``,
``CausalConvChannelLast``, ``CausalConvAfterNorm``); all three compute the same map: zeros
before the first frame (kernel - 1 of them), zeros around the sides (kernel // 2), then the
convolution. So one :class:`CausalConv3d` stands for them, holding its ``nn.Conv3d`` as ``conv``
(the checkpoint's ``<name>.conv.weight``). The reference's version-2 model normalises per frame
(it sets ``base_group_norm.spatial`` for the process); here each block is told (``per_frame``).
Every reference call runs with ``is_init=True`` (causal padding), the only path kept.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = 32  # every GroupNorm of the reference has 32 groups


def group_norm(x: torch.Tensor, norm: nn.GroupNorm, per_frame: bool, silu: bool = False) -> torch.Tensor:
    """``norm`` over each frame (version 2) or over the whole clip (version 1), then SiLU if asked."""
    if per_frame:
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        out = F.group_norm(frames, norm.num_groups, norm.weight, norm.bias, norm.eps).reshape(b, t, c, h, w).transpose(1, 2)
    else:
        out = F.group_norm(x, norm.num_groups, norm.weight, norm.bias, norm.eps)
    return F.silu(out) if silu else out


def causal_pad(x: torch.Tensor, kernel: tuple[int, ...]) -> torch.Tensor:
    kt, kh, kw = kernel
    return F.pad(x, (kw // 2, kw // 2, kh // 2, kh // 2, kt - 1, 0))


class CausalConv3d(nn.Module):
    """Zeros before the first frame and around the sides, then ``conv``.

    A large input (``SPLIT_NUMEL`` elements in or out, as the reference's
    ``base_conv3d_channel_last``) is convolved in 4 slices of output frames, each with the
    ``kernel - 1`` input frames it needs: the same values at a lower memory peak."""

    SPLIT_NUMEL = 2**30

    def __init__(self, chan_in: int, chan_out: int, kernel_size: int | tuple[int, int, int], stride: int | tuple[int, int, int] = 1) -> None:
        super().__init__()
        kernel = (kernel_size,) * 3 if isinstance(kernel_size, int) else tuple(kernel_size)
        stride = (stride, 1, 1) if isinstance(stride, int) else tuple(stride)
        self.conv = nn.Conv3d(chan_in, chan_out, kernel, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sliced_conv(causal_pad(x, self.conv.kernel_size), self.conv, self.conv)


def sliced_conv(x: torch.Tensor, conv: nn.Conv3d, run: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``run(x)``, ``conv``'s convolution without time padding, in 4 slices of output frames when large."""
    big = max(x.numel(), x.numel() // conv.in_channels * conv.out_channels) >= CausalConv3d.SPLIT_NUMEL
    if not big or conv.stride[0] != 1 or x.shape[2] < 8:
        return run(x)
    k = conv.kernel_size[0]
    frames = x.shape[2] - k + 1
    step = frames // 4
    bounds = [0, step, 2 * step, 3 * step, frames]
    return torch.cat([run(x[:, :, a : b + k - 1]) for a, b in zip(bounds, bounds[1:])], dim=2)


class CausalConvOut(nn.Conv3d):
    """The decoder's last convolution: causal like :class:`CausalConv3d`, but the checkpoint holds
    it as ``decoder.conv_out.weight`` (no inner ``conv``; the reference renames it on loading)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sliced_conv(causal_pad(x, self.kernel_size), self, lambda part: self._conv_forward(part, self.weight, self.bias))


class ResnetBlock(nn.Module):
    """The reference's ``Resnet3DBlock``: GroupNorm, SiLU, causal 3x3x3 convolution, twice, plus the
    input (through a 1x1x1 ``nin_shortcut`` where the width changes)."""

    def __init__(self, in_channels: int, out_channels: int, per_frame: bool) -> None:
        super().__init__()
        self.per_frame = per_frame
        self.norm1 = nn.GroupNorm(GROUPS, in_channels)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3)
        self.norm2 = nn.GroupNorm(GROUPS, out_channels)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3)
        if in_channels != out_channels:
            self.nin_shortcut = CausalConv3d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(group_norm(x, self.norm1, self.per_frame, silu=True))
        h = self.conv2(group_norm(h, self.norm2, self.per_frame, silu=True))
        return h + (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x)


class AttnBlock(nn.Module):
    """One head as wide as the block over every position of the clip (frames, rows, columns
    flattened), causal in that order, as the reference's ``AttnBlock``."""

    def __init__(self, channels: int, per_frame: bool) -> None:
        super().__init__()
        self.per_frame = per_frame
        self.norm = nn.GroupNorm(GROUPS, channels)
        self.q, self.k, self.v, self.proj_out = (CausalConv3d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        n = group_norm(x, self.norm, self.per_frame)
        q, k, v = (proj(n).flatten(2).transpose(1, 2)[:, None] for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, 0].transpose(1, 2).reshape(b, c, t, h, w)
        return self.proj_out(out) + x


def per_frame_2d(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A 2-D layer on every frame of [B, C, T, H, W]."""
    b, _, t = x.shape[:3]
    out = layer(x.transpose(1, 2).flatten(0, 1))
    return out.unflatten(0, (b, t)).transpose(1, 2)


class Downsample2D(nn.Module):
    """Halves rows and columns of each frame: one zero row and column after, a 3x3 stride-2 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return per_frame_2d(lambda f: self.conv(F.pad(f, (0, 1, 0, 1))), x)


class Downsample3D(nn.Module):
    """Halves frames, rows and columns: a causal 3x3x3 stride-2 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = CausalConv3d(channels, channels, 3, stride=(2, 2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample2D(nn.Module):
    """Doubles rows and columns of each frame: nearest, then a 3x3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return per_frame_2d(lambda f: self.conv(F.interpolate(f, scale_factor=2.0, mode="nearest")), x)


class UpsampleBlock(nn.Module):
    """The reference's ``Res3DBlockUpsample``: conv, norm, SiLU, conv, norm, plus the input, SiLU,
    plus the input again (the reference adds its residual twice)."""

    def __init__(self, channels: int, per_frame: bool) -> None:
        super().__init__()
        self.per_frame = per_frame
        self.conv1 = CausalConv3d(channels, channels, 3)
        self.norm1 = nn.GroupNorm(GROUPS, channels)
        self.conv2 = CausalConv3d(channels, channels, 3)
        self.norm2 = nn.GroupNorm(GROUPS, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = group_norm(self.conv1(x), self.norm1, self.per_frame, silu=True)
        h = group_norm(self.conv2(h), self.norm2, self.per_frame)
        return F.silu(h + x) + x


class Upsample3D(nn.Module):
    """Doubles frames, rows and columns: nearest, then :class:`UpsampleBlock` (as ``conv3d``)."""

    def __init__(self, channels: int, per_frame: bool) -> None:
        super().__init__()
        self.conv3d = UpsampleBlock(channels, per_frame)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3d(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def space_time_to_channels(x: torch.Tensor, factor: int) -> torch.Tensor:
    """[B, C, T, H, W] -> [B, C f^3, (T + f - 1) / f, H / f, W / f]: ``f - 1`` zero frames first,
    then each f x f x f cube into channels (channel-major, then time, row, column offsets)."""
    x = F.pad(x, (0, 0, 0, 0, factor - 1, 0))
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t // factor, factor, h // factor, factor, w // factor, factor)
    return x.permute(0, 1, 3, 5, 7, 2, 4, 6).reshape(b, c * factor**3, t // factor, h // factor, w // factor)


def channels_to_space_time(x: torch.Tensor, factor: int) -> torch.Tensor:
    """The inverse layout: [B, C f^3, T, H, W] -> [B, C, T f - f + 1, H f, W f] (the first ``f - 1`` frames dropped)."""
    b, c, t, h, w = x.shape
    c //= factor**3
    x = x.reshape(b, c, factor, factor, factor, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, c, t * factor, h * factor, w * factor)[:, :, factor - 1 :]


def averaged_shortcut(x: torch.Tensor, factor: int, out_channels: int) -> torch.Tensor:
    """The reference's ``PixelUnshuffleChannelAveragingDownSampleLayer3D``: cubes into channels, then
    consecutive channels averaged down to ``out_channels``."""
    x = space_time_to_channels(x, factor)
    b, c = x.shape[:2]
    return x.reshape(b, out_channels, c // out_channels, *x.shape[2:]).mean(dim=2)


def duplicated_shortcut(x: torch.Tensor, factor: int, out_channels: int) -> torch.Tensor:
    """The reference's ``ChannelDuplicatingPixelUnshuffleUpSampleLayer3D``: each channel repeated, then channels into cubes."""
    return channels_to_space_time(x.repeat_interleave(out_channels * factor**3 // x.shape[1], dim=1), factor)


class ConvToChannels(nn.Module):
    """The reference's ``ConvPixelUnshuffleDownSampleLayer3D``: a causal 3x3x3 convolution, then cubes into channels."""

    def __init__(self, in_channels: int, out_channels: int, factor: int) -> None:
        super().__init__()
        self.factor = factor
        self.conv = CausalConv3d(in_channels, out_channels // factor**3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return space_time_to_channels(self.conv(x), self.factor)


class ConvToSpaceTime(nn.Module):
    """The reference's ``ConvPixelShuffleUpSampleLayer3D``: a causal 3x3x3 convolution, then channels into cubes."""

    def __init__(self, in_channels: int, out_channels: int, factor: int) -> None:
        super().__init__()
        self.factor = factor
        self.conv = CausalConv3d(in_channels, out_channels * factor**3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return channels_to_space_time(self.conv(x), self.factor)
