"""What preprocess computes from a waveform: the flow's log mel, the speech tokens, F0.

* The mel is matcha's ``mel_spectrogram`` at the yaml's ``feat_extractor`` settings (24 kHz, n_fft
  and window 1920, hop 480, 80 slaney-normalised mel bins from ``fmin`` to ``fmax`` (null: the
  Nyquist frequency), reflect padding of (n_fft - hop) / 2 each side, no centring, magnitude
  ``sqrt(power + 1e-9)``, ``log(clamp(x, 1e-5))``). As CosyVoice's ``compute_fbank`` does, the
  waveform is first zero-padded to whole speech tokens (960 samples at 25 Hz), so a clip has
  exactly ``token_mel_ratio`` (2) mel frames per token.
* Speech tokens come from a :class:`SpeechTokenizer`: ``(waveform at the model's rate) -> ids`` at
  ``token_frame_rate`` (25 Hz). The public one (``speech_tokenizer_v3.onnx``) needs onnxruntime
  and is not run here; the demo's is :class:`DemoSpeechTokenizer`, a k-means codebook of mel
  frame pairs fitted at ``init:demo`` (:mod:`mm_pack_cosyvoice3.demo`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from mm_pack_cosyvoice3.config import MelConfig

DEMO_TOKENIZER = "speech_tokenizer_demo.safetensors"


def _slaney_mel(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    return np.where(f < 1000, 3 * f / 200, 15 + 27 * np.log(np.maximum(f, 1e-9) / 1000) / np.log(6.4))


def _slaney_hz(m: np.ndarray) -> np.ndarray:
    return np.where(m < 15, 200 * m / 3, 1000 * np.exp(np.log(6.4) / 27 * (m - 15)))


def mel_filters(cfg: MelConfig) -> torch.Tensor:
    """librosa's ``filters.mel(htk=False, norm="slaney")``, as matcha builds it: num_mels x (n_fft/2+1)."""
    fmax = cfg.fmax if cfg.fmax is not None else cfg.sampling_rate / 2
    bins = np.linspace(0, cfg.sampling_rate / 2, cfg.n_fft // 2 + 1)
    hz = _slaney_hz(np.linspace(_slaney_mel(cfg.fmin), _slaney_mel(fmax), cfg.num_mels + 2))
    ramps = hz[:, None] - bins[None, :]
    fdiff = np.diff(hz)
    lower, upper = -ramps[:-2] / fdiff[:-1, None], ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper)) * (2.0 / (hz[2:] - hz[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


def pad_to_tokens(wav: np.ndarray, sample_rate: int, token_rate: int) -> np.ndarray:
    """Zero-pad to whole speech tokens (CosyVoice's ``compute_fbank(num_frames=960)`` at 24 kHz)."""
    per = sample_rate // token_rate
    return np.concatenate([wav, np.zeros(-len(wav) % per, dtype=wav.dtype)])


def log_mel(wav: Any, cfg: MelConfig) -> torch.Tensor:
    """frames x num_mels log mel of a mono waveform (matcha's ``mel_spectrogram``)."""
    y = torch.as_tensor(np.asarray(wav), dtype=torch.float32).reshape(1, -1)
    pad = (cfg.n_fft - cfg.hop_size) // 2
    y = torch.nn.functional.pad(y[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(y, cfg.n_fft, cfg.hop_size, cfg.win_size, window=torch.hann_window(cfg.win_size), center=cfg.center, return_complex=True)
    spec = torch.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    return torch.log(torch.clamp(mel_filters(cfg) @ spec[0], min=1e-5)).T.contiguous()


def frame_f0(wav: np.ndarray, sample_rate: int, hop: int, frames: int) -> torch.Tensor:
    """F0 (Hz) per mel frame, 0 where unvoiced: the fixed checker's segments and their pitch
    (``mmcore.data``; right for the demo's chords, a stand-in for a real pitch tracker)."""
    from mmcore.data import pitch_segments

    f0 = torch.zeros(frames)
    for a, b, pitch in pitch_segments(wav, sample_rate):
        f0[a // hop : min(frames, -(-b // hop))] = pitch
    return f0


class SpeechTokenizer(Protocol):
    """``(waveform at the model's sample rate, float32 mono) -> speech token ids``, ``rate`` per second."""

    rate: int

    def __call__(self, wav: np.ndarray) -> list[int]: ...


class DemoSpeechTokenizer:
    """A k-means codebook over pairs of mel frames (one token per 40 ms) of what a frame *sounds
    like*, not how loud it is: each frame's log mel is shifted so its own loudest bin is 0,
    clamped ``DEPTH`` below it and blurred along frequency (Gaussian, ``BLUR`` bins: a digit's
    +-2 % detuning moves its tone up to half a bin at 2 kHz, which k-means would otherwise split
    into codes of their own), and a frame whose loudest bin is within ``GATE`` of the clip's
    noise floor (the median of all its bins: most bins of most frames hold only noise) is silence,
    one fixed vector. The demo's clips differ in loudness (0.3-0.9 over a fixed noise floor) and
    in which digit sets the clip's loudest bin; neither reaches these features, so a digit's
    frames fall on one code whatever the clip."""

    GATE = 2.0
    DEPTH = 1.5
    BLUR = 1.0
    KIND = "cosyvoice3 demo speech tokenizer: frame-normalised log mel pairs"

    def __init__(self, centroids: torch.Tensor, mel: MelConfig, rate: int = 25) -> None:
        self.centroids, self.mel, self.rate = centroids.float(), mel, rate

    @classmethod
    def features(cls, mel: torch.Tensor) -> torch.Tensor:
        mel = mel[: mel.shape[0] // 2 * 2]
        peak = mel.max(dim=1, keepdim=True).values
        shape = (mel - peak).clamp(min=-cls.DEPTH)
        voiced = peak > mel.median() + cls.GATE
        shape = torch.where(voiced, shape, torch.full_like(shape, -cls.DEPTH))
        if cls.BLUR > 0:
            taps = torch.arange(-3, 4, dtype=shape.dtype)
            kernel = torch.exp(-0.5 * (taps / cls.BLUR) ** 2)
            shape = torch.nn.functional.conv1d(shape[:, None] + cls.DEPTH, (kernel / kernel.sum())[None, None], padding=3)[:, 0] - cls.DEPTH
        return shape.reshape(-1, 2 * mel.shape[1])

    def tokens_of_mel(self, mel: torch.Tensor) -> list[int]:
        return torch.cdist(self.features(mel), self.centroids).argmin(dim=1).tolist()

    def __call__(self, wav: np.ndarray) -> list[int]:
        return self.tokens_of_mel(log_mel(pad_to_tokens(wav, self.mel.sampling_rate, self.rate), self.mel))

    @classmethod
    def fit(cls, mels: list[torch.Tensor], size: int, mel: MelConfig, seed: int, iterations: int = 30) -> "DemoSpeechTokenizer":
        """k-means (core's :func:`~mmcore.engines.kmeans_codebook`) of the clips' frame pairs."""
        from mmcore.engines import kmeans_codebook

        return cls(kmeans_codebook(torch.cat([cls.features(m) for m in mels]), size, seed, iterations), mel)

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        save_file({"centroids": self.centroids.contiguous()}, str(path), metadata={"kind": self.KIND, "rate": str(self.rate)})


def speech_tokenizer(model_dir: Path, mel: MelConfig, rate: int) -> SpeechTokenizer | None:
    """The folder's tokenizer: the demo's codebook, or None (records must then carry ``speech_token``)."""
    path = Path(model_dir) / DEMO_TOKENIZER
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        kind = (f.metadata() or {}).get("kind")
        if kind != DemoSpeechTokenizer.KIND:
            from mmcore import StageError

            raise StageError(f"{path}: a demo speech tokenizer of another kind ({kind!r}); refit it (init:demo)")
        return DemoSpeechTokenizer(f.get_tensor("centroids"), mel, rate)


def griffin_lim(mel: torch.Tensor, cfg: MelConfig, iterations: int = 32) -> torch.Tensor:
    """A waveform whose log mel is about ``mel`` (num_mels x frames, the flow's output): the mel
    filterbank's pseudo-inverse gives linear magnitudes, which :func:`mmcore.data.griffin_lim`
    voices (no learned weights: ``speech.vocoder: griffin_lim`` voices a mel where no trained
    vocoder is at hand, the demo's). Peak-normalised to 0.5."""
    from mmcore.data import griffin_lim as voice

    magnitude = (torch.linalg.pinv(mel_filters(cfg).double()) @ torch.exp(mel.double())).clamp(min=0)
    return voice(magnitude, cfg.n_fft, cfg.hop_size, cfg.win_size, iterations, length=mel.shape[1] * cfg.hop_size)
