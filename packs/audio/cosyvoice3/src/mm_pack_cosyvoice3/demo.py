"""The demo: a tiny CosyVoice3 learns to say spoken-digit sentences ("seven one zero").

Data: :mod:`mmcore.data`'s spoken digits at speech pace (about three digits a second), written at
24 kHz as ``{"audio": "clips/00001.wav", "text": "seven one zero"}`` JSONL, the path a user's
dataset takes. ``init:demo`` builds the tiny random checkpoint and fits, once, the two parts
CosyVoice trains apart from the LM and the flow, on clips of their own (another seed; none of
them is a held-out clip), frozen thereafter:

* the speech tokenizer: the public S3 tokenizer is an ONNX model (``speech_tokenizer_v3.onnx``,
  onnxruntime) not run here; :class:`~mm_pack_cosyvoice3.features.DemoSpeechTokenizer` stands in
  (k-means of mel frame pairs, 25 Hz, ``speech_token_size`` codes; ``speech_tokenizer_demo.
  safetensors`` in the folder);
* the HiFT vocoder (``hift.pt``): first its F0 predictor (mel -> F0, L1 to the clips' F0), then the
  rest, mel -> waveform with a mel L1 + multi-resolution STFT loss, the harmonic source driven by
  the true F0 (teacher forcing). No discriminator: the chords need none (CosyVoice's recipe trains HiFT as a
  GAN).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

RATE = 24000
PACE = "speech"
FIT_CLIPS = 96
VOCODER_STEPS = 200
F0_STEPS = 400
CROP_FRAMES = 24  # 0.48 s crops for the vocoder
# the flow's DiT: at 32 wide its CFM loss stays near 1.0 and its mels' tone bins jitter (README)
DIT_DIM, DIT_HEADS = 128, 4
# every clip's peak: TTS corpora are loudness-normalised, and the demo's speech tokens say nothing
# of loudness (features.DemoSpeechTokenizer), so a clip's level (0.3-0.9 as drawn) would be left
# for the flow to draw; measured on one seed it changed the spoken WER little (README)
LEVEL = 0.6
# ten digits, silence and the frame pairs that straddle a syllable's edge: with 64 codes k-means
# split a digit over two to six codes by its detuning (README); 16 give each digit one, mostly
TOKENIZER_CODES = 16


def levelled(wav: np.ndarray) -> np.ndarray:
    """``wav`` scaled to the demo's peak ``LEVEL``."""
    return wav * (LEVEL / max(float(np.abs(wav).max()), 1e-8))


def write_demo_dataset(folder: Path, samples: int, seed: int, eval_fraction: float = 0.1) -> tuple[Path, Path]:
    """Write ``train.jsonl``, ``eval.jsonl`` and their 24 kHz wav files under ``folder``: the clips
    of ``mmcore.data.write_spoken_digit_clips`` (the same draws), each levelled to ``LEVEL``."""
    from mmcore.data import DIGIT_WORDS, digits_clip, write_audio

    rng = np.random.default_rng(seed)
    records = []
    for i in range(samples):
        digits = [int(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 5)))]
        name = f"clips/{i:05d}.wav"
        write_audio(Path(folder) / name, levelled(digits_clip(digits, rng, pace=PACE, rate=RATE)), RATE)
        records.append({"audio": name, "text": " ".join(DIGIT_WORDS[d] for d in digits)})
    cut = int(len(records) * (1 - eval_fraction))
    train, held_out = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records[:cut]))
    held_out.write_text("".join(json.dumps(r) + "\n" for r in records[cut:]))
    return train, held_out


def fit_clips(seed: int, count: int = FIT_CLIPS) -> list[np.ndarray]:
    from mmcore.data import digits_clip

    rng = np.random.default_rng(10_000 + seed)
    clips = []
    for _ in range(count):
        digits = [int(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 5)))]
        clips.append(levelled(digits_clip(digits, rng, pace=PACE, rate=RATE)).astype(np.float32))
    return clips


def stft_loss(fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Multi-resolution STFT loss (spectral convergence + log magnitude L1) at three resolutions."""
    total = fake.new_zeros(())
    for n_fft, hop in ((512, 128), (1024, 256), (256, 64)):
        window = torch.hann_window(n_fft)
        a = torch.stft(fake, n_fft, hop, window=window, return_complex=True).abs().clamp(min=1e-5)
        b = torch.stft(real, n_fft, hop, window=window, return_complex=True).abs().clamp(min=1e-5)
        total = total + torch.linalg.norm(b - a) / torch.linalg.norm(b) + F.l1_loss(a.log(), b.log())
    return total / 3


def fit_vocoder(hift: Any, mel_cfg: Any, clips: list[np.ndarray], seed: int, steps: int = VOCODER_STEPS) -> dict[str, float]:
    """Fit ``hift`` in place on ``clips`` (mel -> waveform), as the module docstring says."""
    from mmcore.engines import fit_demo_autoencoder

    from mm_pack_cosyvoice3.features import frame_f0, log_mel, pad_to_tokens

    hop = mel_cfg.hop_size
    items = []
    for wav in clips:
        wav = pad_to_tokens(wav, RATE, 25)
        mel = log_mel(wav, mel_cfg)
        items.append((torch.from_numpy(wav), mel.T.contiguous(), frame_f0(wav, RATE, hop, mel.shape[0])))
    items = [it for it in items if it[1].shape[1] > CROP_FRAMES]
    last: dict[str, float] = {}
    longest = max(it[1].shape[1] for it in items)
    mels = torch.stack([F.pad(it[1], (0, longest - it[1].shape[1]), value=float(it[1].min())) for it in items])
    f0s = torch.stack([F.pad(it[2], (0, longest - it[2].shape[0])) for it in items])

    def f0_loss(step: int, draw: torch.Generator) -> torch.Tensor:  # the F0 predictor first, at frame rate
        pick = torch.randint(len(items), (16,), generator=draw)
        loss = F.l1_loss(hift.f0_predictor(mels[pick]) / 500, f0s[pick] / 500)
        last["f0_l1_hz"] = float(loss.detach()) * 500
        return loss

    fit_demo_autoencoder(hift.f0_predictor, f0_loss, steps=F0_STEPS, lr=5e-3, seed=seed)

    def loss_of(step: int, draw: torch.Generator) -> torch.Tensor:
        wavs, mels, f0s = [], [], []
        for i in torch.randint(len(items), (4,), generator=draw).tolist():
            wav, mel, f0 = items[i]
            start = int(torch.randint(mel.shape[1] - CROP_FRAMES + 1, (1,), generator=draw))
            wavs.append(wav[start * hop : (start + CROP_FRAMES) * hop])
            mels.append(mel[:, start : start + CROP_FRAMES])
            f0s.append(f0[start : start + CROP_FRAMES])
        wav, mel, f0 = torch.stack(wavs), torch.stack(mels), torch.stack(f0s)
        source = F.interpolate(f0[:, None], scale_factor=hop, mode="nearest").transpose(1, 2)
        fake = hift.decode(mel, hift.m_source(source, draw).transpose(1, 2))
        fake_mel = torch.stack([log_mel_torch(x, mel_cfg) for x in fake])
        mel_l1 = F.l1_loss(fake_mel, mel.transpose(1, 2))
        last["mel_l1"] = float(mel_l1.detach())
        return mel_l1 + stft_loss(fake, wav)

    for p in hift.f0_predictor.parameters():
        p.requires_grad_(False)
    fit_demo_autoencoder(hift, loss_of, steps=steps, lr=2e-3, seed=seed)
    for p in hift.f0_predictor.parameters():
        p.requires_grad_(True)
    return last


def log_mel_torch(wav: torch.Tensor, cfg: Any) -> torch.Tensor:
    """:func:`~mm_pack_cosyvoice3.features.log_mel` with gradients (frames x mels)."""
    from mm_pack_cosyvoice3.features import mel_filters

    pad = (cfg.n_fft - cfg.hop_size) // 2
    y = F.pad(wav[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(y, cfg.n_fft, cfg.hop_size, cfg.win_size, window=torch.hann_window(cfg.win_size), center=False, return_complex=True)
    spec = torch.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    return torch.log(torch.clamp(mel_filters(cfg) @ spec[0], min=1e-5)).T


def fit_tokenizer(out_dir: Path, cfg: Any, clips: list[np.ndarray], seed: int) -> None:
    """The demo speech tokenizer of ``TOKENIZER_CODES`` codes (at most ``cfg.lm.speech_token_size``),
    fitted on ``clips`` and saved in the folder."""
    from mm_pack_cosyvoice3.features import DEMO_TOKENIZER, DemoSpeechTokenizer, log_mel, pad_to_tokens

    mels = [log_mel(pad_to_tokens(c, RATE, cfg.token_frame_rate), cfg.mel) for c in clips]
    DemoSpeechTokenizer.fit(mels, min(TOKENIZER_CODES, cfg.lm.speech_token_size), cfg.mel, seed).save(Path(out_dir) / DEMO_TOKENIZER)


def build_tiny_with_tokenizer(out_dir: Path, seed: int = 0) -> Path:
    """``init:tiny``: the tiny random checkpoint and a demo tokenizer fitted on 16 clips (HiFT random)."""
    from mm_pack_cosyvoice3.model import read_configs
    from mm_pack_cosyvoice3.tiny import build_tiny_checkpoint

    out_dir = build_tiny_checkpoint(Path(out_dir), seed=seed)
    fit_tokenizer(out_dir, read_configs(out_dir)[0], fit_clips(seed, 16), seed)
    return out_dir


def build_demo_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """``init:demo``: the tiny checkpoint with a fitted demo speech tokenizer and a fitted HiFT."""
    from mm_pack_cosyvoice3.model import load_pretrained, save_public
    from mm_pack_cosyvoice3.tiny import build_tiny_checkpoint

    out_dir = build_tiny_checkpoint(Path(out_dir), seed=seed, hidden=64, speech_tokens=64, f0_channels=64, dit_dim=DIT_DIM, dit_heads=DIT_HEADS)
    model = load_pretrained(out_dir)
    cfg = model.cfg
    clips = fit_clips(seed)
    fit_tokenizer(out_dir, cfg, clips, seed)
    report = fit_vocoder(model.hift, cfg.mel, clips, seed)
    save_public(model, out_dir)
    (out_dir / "demo_fit.json").write_text(json.dumps({"tokenizer_codes": cfg.lm.speech_token_size, "fit_clips": len(clips), "vocoder_steps": VOCODER_STEPS, **report}, indent=1))
    return out_dir
