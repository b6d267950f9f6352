"""The CosyVoice3 vocoder: ``CausalHiFTGenerator`` (HiFT: a neural-source-filter excitation plus
an ISTFT head) with its ``CausalConvRNNF0Predictor``; mel (B x 80 x T) -> waveform of
``prod(upsample_rates) * hop_len`` (480 at 24 kHz) samples per frame.

Parameter names equal the public ``hift.pt`` keys after CosyVoice's own ``generator.`` prefix
strip; weight-normed convolutions use torch's parametrizations (``...parametrizations.weight.
original0/original1``). In eval mode the excitation noise is fixed, as in the reference (there
torch.rand tensors drawn once at construction): here drawn from seeded generators, per call.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from mm_pack_cosyvoice3.config import HiftConfig


class CausalConv1d(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel_size: int, dilation: int = 1, causal_type: str = "left") -> None:
        super().__init__(cin, cout, kernel_size, dilation=dilation)
        self.causal_padding = int((kernel_size * dilation - dilation) / 2) * 2 + (kernel_size + 1) % 2
        self.causal_type = causal_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (self.causal_padding, 0) if self.causal_type == "left" else (0, self.causal_padding)
        return super().forward(F.pad(x, pad))


class CausalConv1dDownSample(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int) -> None:
        super().__init__(cin, cout, kernel_size, stride)
        self.causal_padding = stride - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.causal_padding, 0)))


class CausalConv1dUpsample(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int) -> None:
        super().__init__(cin, cout, kernel_size)
        self.stride_up = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=self.stride_up, mode="nearest")
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha) ** 2


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilations: list[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList([weight_norm(CausalConv1d(channels, channels, kernel_size, d)) for d in dilations])
        self.convs2 = nn.ModuleList([weight_norm(CausalConv1d(channels, channels, kernel_size, 1)) for _ in dilations])
        self.activations1 = nn.ModuleList([Snake(channels) for _ in dilations])
        self.activations2 = nn.ModuleList([Snake(channels) for _ in dilations])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class CausalConvRNNF0Predictor(nn.Module):
    def __init__(self, in_channels: int, cond_channels: int, num_class: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            conv = CausalConv1d(in_channels if i == 0 else cond_channels, cond_channels, 4 if i == 0 else 3, causal_type="right" if i == 0 else "left")
            layers += [weight_norm(conv), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


class SourceModuleHnNSF(nn.Module):
    """Harmonic sines of f0 (SineGen2: phase integrated at frame rate, then held), merged by one linear."""

    def __init__(self, cfg: HiftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)
        self.fixed: dict[str, torch.Tensor] = {}  # eval-mode noise overrides (rand_ini, sine_noise)

    def eval_noise(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if "rand_ini" in self.fixed:
            return self.fixed["rand_ini"].to(device), self.fixed["sine_noise"][:, :length].to(device)
        rand_ini = torch.rand(1, self.cfg.nb_harmonics + 1, generator=torch.Generator().manual_seed(1))
        rand_ini[:, 0] = 0
        noise = torch.rand(1, length, self.cfg.nb_harmonics + 1, generator=torch.Generator().manual_seed(2))
        return rand_ini.to(device), noise.to(device)

    def forward(self, f0: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:  # f0: (B, L, 1)
        cfg, scale = self.cfg, cfg_scale(self.cfg)
        with torch.no_grad():
            harmonics = f0 * torch.arange(1, cfg.nb_harmonics + 2, device=f0.device, dtype=f0.dtype)
            rad = (harmonics / cfg.sampling_rate) % 1
            if self.training:
                rand_ini = torch.rand(f0.shape[0], harmonics.shape[2], generator=generator).to(rad)
                rand_ini[:, 0] = 0
                noise_src = torch.randn(harmonics.shape, generator=generator).to(rad)
            else:
                rand_ini, noise_src = self.eval_noise(f0.shape[1], f0.device)
                rand_ini, noise_src = rand_ini.to(rad), noise_src.to(rad)
            rad[:, 0, :] = rad[:, 0, :] + rand_ini
            rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / scale, mode="linear").transpose(1, 2)
            phase = torch.cumsum(rad, dim=1) * 2 * math.pi
            phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=scale, mode="nearest").transpose(1, 2)
            sines = torch.sin(phase) * cfg.nsf_alpha
            uv = (f0 > cfg.nsf_voiced_threshold).to(sines)
            noise = (uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3) * noise_src
            sines = sines * uv + noise
        return torch.tanh(self.l_linear(sines))


def cfg_scale(cfg: HiftConfig) -> int:
    return cfg.hop_size


class CausalHiFTGenerator(nn.Module):
    def __init__(self, cfg: HiftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        base, n_fft = cfg.base_channels, cfg.n_fft
        self.m_source = SourceModuleHnNSF(cfg)
        self.conv_pre = weight_norm(CausalConv1d(cfg.in_channels, base, cfg.conv_pre_look_right + 1, causal_type="right"))
        self.ups = nn.ModuleList([weight_norm(CausalConv1dUpsample(base // 2**i, base // 2 ** (i + 1), k, u)) for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes))])
        rates = [1, *cfg.upsample_rates[::-1][:-1]]
        cum = [math.prod(rates[: i + 1]) for i in range(len(rates))][::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k, d) in enumerate(zip(cum, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
            ch = base // 2 ** (i + 1)
            self.source_downs.append(CausalConv1d(n_fft + 2, ch, 1) if u == 1 else CausalConv1dDownSample(n_fft + 2, ch, u * 2, u))
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = base // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(ResBlock(ch, k, d))
        self.conv_post = weight_norm(CausalConv1d(ch, n_fft + 2, 7))
        self.f0_predictor = CausalConvRNNF0Predictor(cfg.in_channels, cfg.f0_cond_channels, cfg.f0_num_class)

    def window(self, device: torch.device) -> torch.Tensor:
        return torch.hann_window(self.cfg.n_fft, periodic=True, dtype=torch.float64).float().to(device)

    def decode(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        cfg, n_fft = self.cfg, self.cfg.n_fft
        spec = torch.view_as_real(torch.stft(s.squeeze(1), n_fft, cfg.hop_len, n_fft, window=self.window(s.device), return_complex=True))
        s_stft = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
        x = self.conv_pre(x)
        kernels = len(cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            x = sum(self.resblocks[i * kernels + j](x) for j in range(kernels)) / kernels
        x = self.conv_post(F.leaky_relu(x))
        magnitude = torch.exp(x[:, : n_fft // 2 + 1]).clip(max=1e2)
        phase = torch.sin(x[:, n_fft // 2 + 1 :])
        wav = torch.istft(torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase)), n_fft, cfg.hop_len, n_fft, window=self.window(x.device))
        return wav.clamp(-cfg.audio_limit, cfg.audio_limit)

    def f0(self, mel: torch.Tensor) -> torch.Tensor:
        """F0 per frame; at inference the predictor runs in float64, as the reference does (there it
        casts the module; here a float64 copy of its weights, so the model's dtype is untouched)."""
        if self.training:
            return self.f0_predictor(mel)
        params = {k: v.double() for k, v in self.f0_predictor.state_dict().items()}
        return torch.func.functional_call(self.f0_predictor, params, (mel.double(),)).to(mel.dtype)

    def forward(self, mel: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Waveform (B x samples) and f0 (B x T) for a mel (B x 80 x T)."""
        f0 = self.f0(mel)
        s = F.interpolate(f0[:, None], scale_factor=self.cfg.hop_size, mode="nearest").transpose(1, 2)
        s = self.m_source(s, generator).transpose(1, 2)
        return self.decode(mel, s), f0
