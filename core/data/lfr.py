"""Kaldi log-mel filterbanks and low frame rate (LFR) stacking without torchaudio: the SAN-M
audio towers' front end (FunASR's ``WavFrontend``; transformers' ``FunAsrNanoFeatureExtractor``),
shared by the packs of Fun-ASR-Nano and Ming-Lite-Omni (SDK 1.33; was ``mm_pack_funasr.features``).

:func:`kaldi_fbank` is ``torchaudio.compliance.kaldi.fbank`` with the arguments those front ends
pass (25 ms Hamming frames every 10 ms, ``snip_edges``, DC offset removed, pre-emphasis 0.97,
power spectrum over a 512-point FFT, triangular mel bins from 20 Hz to Nyquist, natural log
floored at float32's epsilon; no dither): torchaudio has no wheel for this torch on CPU-only
machines. :func:`stack_lfr` is the LFR step: ``num_frames_lfr`` frames centred on every
``stride_lfr``-th frame, edges repeated, so a clip of F frames gives ceil(F / stride) rows of
``mels x num_frames_lfr``. The funasr pack's tests compare both with transformers' extractor.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

__all__ = ["LFR_DEFAULTS", "kaldi_fbank", "stack_lfr", "lfr_features", "mel_banks"]

#: the front end's defaults (``FunAsrNanoFeatureExtractor()``: the released checkpoint's)
LFR_DEFAULTS = {"feature_size": 80, "sampling_rate": 16000, "frame_length": 25, "frame_shift": 10, "num_frames_lfr": 7, "stride_lfr": 6}


def mel(freq: Any) -> Any:
    return 1127.0 * (np.log1p(freq / 700.0) if isinstance(freq, np.ndarray) else math.log(1.0 + freq / 700.0))


@lru_cache(maxsize=4)
def mel_banks(bins: int, fft_size: int, rate: float, low: float = 20.0) -> Any:
    """Kaldi's triangular mel filters [bins, fft_size / 2 + 1] (no VTLN warp), float32."""
    import torch

    half = fft_size // 2
    mel_low, mel_high = mel(low), mel(rate / 2)
    delta = (mel_high - mel_low) / (bins + 1)
    b = torch.arange(bins).unsqueeze(1)
    left, center, right = mel_low + b * delta, mel_low + (b + 1.0) * delta, mel_low + (b + 2.0) * delta
    freqs = (rate / fft_size) * torch.arange(half)
    m = (1127.0 * (1.0 + freqs / 700.0).log()).unsqueeze(0)
    up, down = (m - left) / (center - left), (right - m) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))
    return torch.nn.functional.pad(banks, (0, 1))


def kaldi_fbank(waveform: Any, num_mel_bins: int = 80, frame_length: float = 25.0, frame_shift: float = 10.0, sample_frequency: float = 16000.0) -> Any:
    """Log mel energies [frames, num_mel_bins] of a mono waveform [samples] (float32 tensor)."""
    import torch

    size, shift = int(sample_frequency * frame_length * 0.001), int(sample_frequency * frame_shift * 0.001)
    fft_size = 1 << (size - 1).bit_length()
    if waveform.numel() < size:
        return torch.empty(0, num_mel_bins)
    frames = 1 + (waveform.numel() - size) // shift
    strided = waveform.as_strided((frames, size), (shift * waveform.stride(0), waveform.stride(0)))
    strided = strided - strided.mean(dim=1, keepdim=True)
    previous = torch.nn.functional.pad(strided.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)
    strided = strided - 0.97 * previous[:, :-1]
    strided = strided * torch.hamming_window(size, periodic=False, alpha=0.54, beta=0.46, dtype=strided.dtype)
    strided = torch.nn.functional.pad(strided, (0, fft_size - size))
    power = torch.fft.rfft(strided).abs().pow(2.0)
    energies = torch.mm(power, mel_banks(num_mel_bins, fft_size, float(sample_frequency)).T)
    return torch.max(energies, torch.tensor(torch.finfo(torch.float).eps)).log()


def stack_lfr(features: Any, num_frames_lfr: int = 7, stride_lfr: int = 6) -> Any:
    """[frames, mels] -> [ceil(frames / stride), mels * num_frames_lfr], the extractor's LFR."""
    import torch

    left = (num_frames_lfr - 1) // 2
    padded = torch.cat([features[:1].expand(left, -1), features, features[-1:].expand(num_frames_lfr - 1 - left, -1)])
    out = (features.shape[0] + stride_lfr - 1) // stride_lfr
    need = (out - 1) * stride_lfr + num_frames_lfr
    if need > padded.shape[0]:
        padded = torch.cat([padded, padded[-1:].expand(need - padded.shape[0], -1)])
    return padded.unfold(0, num_frames_lfr, stride_lfr).transpose(1, 2).reshape(out, -1)


def lfr_features(samples: Any, settings: Mapping[str, Any]) -> Any:
    """One clip's features [rows, mels x stack] (float32 tensor), from 16 kHz samples (numpy)."""
    import torch

    s = {**LFR_DEFAULTS, **{k: v for k, v in settings.items() if k in LFR_DEFAULTS}}
    waveform = torch.as_tensor(np.asarray(samples), dtype=torch.float32)
    fbank = kaldi_fbank(waveform, s["feature_size"], s["frame_length"], s["frame_shift"], s["sampling_rate"])
    return stack_lfr(fbank, s["num_frames_lfr"], s["stride_lfr"]) if len(fbank) else fbank
