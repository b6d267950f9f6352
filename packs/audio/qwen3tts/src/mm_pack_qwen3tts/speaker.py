"""The Base checkpoints' speaker encoder (``speaker_encoder.*``): ECAPA-TDNN from a log-mel
(B x T x mel_dim) to one speaker embedding (B x enc_dim, the talker's width), which fills the
prompt's speaker slot for voice cloning. Names and arithmetic as the reference's
``Qwen3TTSSpeakerEncoder``: reflect-padded "same" convs, Res2Net chunks, squeeze-excitation,
multi-layer aggregation of the SE-Res2Net outputs and attentive statistics pooling. The mel front
end (librosa's slaney filters) is not here."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList([TDNN(channels // scale, channels // scale, kernel, dilation) for _ in range(scale - 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        out = [parts[0]]
        for i, part in enumerate(parts[1:]):
            out.append(self.blocks[i](part if i == 0 else part + out[-1]))
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = _conv(channels, squeeze), _conv(squeeze, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))


class SERes2Net(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, squeeze: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNN(c_in, c_out, 1, 1)
        self.res2net_block = Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNN(c_out, c_out, 1, 1)
        self.se_block = SqueezeExcitation(c_out, squeeze)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _statistics(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class AttentivePooling(nn.Module):
    def __init__(self, channels: int, attention: int) -> None:
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention, 1, 1)
        self.conv = _conv(attention, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        uniform = torch.ones(x.shape[0], 1, length, dtype=x.dtype, device=x.device)
        mean, std = _statistics(x, uniform / uniform.sum(dim=2, keepdim=True))
        context = torch.cat([x, mean.unsqueeze(2).repeat(1, 1, length), std.unsqueeze(2).repeat(1, 1, length)], dim=1)
        weights = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _statistics(x, weights)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        channels = [int(c) for c in cfg.get("enc_channels", [512, 512, 512, 512, 1536])]
        kernels = [int(k) for k in cfg.get("enc_kernel_sizes", [5, 3, 3, 3, 1])]
        dilations = [int(d) for d in cfg.get("enc_dilations", [1, 2, 3, 4, 1])]
        if not len(channels) == len(kernels) == len(dilations):
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations differ in length")
        scale, squeeze = int(cfg.get("enc_res2net_scale", 8)), int(cfg.get("enc_se_channels", 128))
        self.blocks = nn.ModuleList([TDNN(int(cfg.get("mel_dim", 128)), channels[0], kernels[0], dilations[0])])
        self.blocks.extend(SERes2Net(channels[i - 1], channels[i], scale, squeeze, kernels[i], dilations[i]) for i in range(1, len(channels) - 1))
        self.mfa = TDNN(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentivePooling(channels[-1], int(cfg.get("enc_attention_channels", 128)))
        self.fc = _conv(channels[-1] * 2, int(cfg.get("enc_dim", 1024)))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """B x T x mel_dim log-mel -> B x enc_dim."""
        x, outs = mel.transpose(1, 2), []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        return self.fc(self.asp(self.mfa(torch.cat(outs[1:], dim=1)))).squeeze(-1)
