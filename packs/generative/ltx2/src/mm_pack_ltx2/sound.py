"""LTX-2's audio side outside the diffusers classes: the log-mel spectrogram its audio VAE
encodes (diffusers ships only the decoding side: ``audio_vae.decode`` -> mel -> ``vocoder``).

The front end follows LTX-2's reference audio processing as its audio VAE's config states it:
``sample_rate`` and ``mel_hop_length`` from ``audio_vae/config.json``, ``mel_bins`` log-mel
bands (Slaney scale and norm, magnitude, ``log(max(mel, 1e-5))``), a 1024-point Hann STFT
centred; the mono track given to both of the VAE's two (stereo) input channels.
"""

from __future__ import annotations

from typing import Any


def log_mel(samples: Any, audio_vae: Any, n_fft: int = 1024) -> Any:
    """Mono float samples [N] -> log-mel [1, 2, T, mel_bins] (T = N // hop + 1) for ``audio_vae``."""
    import torch
    from transformers.audio_utils import mel_filter_bank

    cfg = audio_vae.config
    rate, hop, bins = int(cfg.sample_rate), int(cfg.mel_hop_length), int(cfg.mel_bins)
    wave = torch.as_tensor(samples, dtype=torch.float32).reshape(-1)
    if wave.numel() < n_fft // 2 + 1:  # reflect padding needs more than half a window
        wave = torch.nn.functional.pad(wave, (0, n_fft // 2 + 1 - wave.numel()))
    spectrum = torch.stft(wave, n_fft=n_fft, hop_length=hop, win_length=n_fft, window=torch.hann_window(n_fft), center=True, pad_mode="reflect", return_complex=True).abs()
    bank = torch.from_numpy(
        mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=bins, min_frequency=0.0, max_frequency=rate / 2, sampling_rate=rate, norm="slaney", mel_scale="slaney")
    ).float()
    mel = torch.log(torch.clamp(bank.T @ spectrum, min=1e-5))  # [bins, T]
    return mel.T[None, None].expand(1, 2, -1, -1).contiguous()


def pack_audio(latents: Any) -> Any:
    """Audio latents [B, C, L, M] -> tokens [B, L, C * M], as ``LTX2Pipeline`` packs them."""
    return latents.transpose(1, 2).flatten(2, 3)


def unpack_audio(tokens: Any, mel_bins: int) -> Any:
    """The inverse of :func:`pack_audio`: [B, L, C * M] -> [B, C, L, M]."""
    return tokens.unflatten(2, (-1, mel_bins)).transpose(1, 2)


def audio_latents(audio_vae: Any, samples: Any) -> Any:
    """Mono samples -> normalised audio latents [C, L, M'] as the pipeline normalises them:
    packed to [L, C * M'], ``(z - latents_mean) / latents_std`` per packed feature, unpacked.
    L is the pipeline's count for that duration, ``round(seconds * rate / hop / 4)`` (the
    causal encoder gives one more for a centred STFT's extra frame; the last is dropped)."""
    import torch

    cfg = audio_vae.config
    length = max(1, round(len(samples) / cfg.mel_hop_length / audio_vae.temporal_compression_ratio))
    with torch.no_grad():
        z = audio_vae.encode(log_mel(samples, audio_vae).to(audio_vae.dtype)).latent_dist.mode()[:, :, :length]
        tokens = (pack_audio(z) - audio_vae.latents_mean) / audio_vae.latents_std
        return unpack_audio(tokens, z.shape[-1])[0]
