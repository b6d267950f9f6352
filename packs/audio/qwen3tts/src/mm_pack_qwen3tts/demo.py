"""The demo: a tiny Qwen3-TTS learns to say digit sentences ("seven one zero") that a fixed
checker understands.

Data: chord "syllables" (a pitch per digit, :func:`mmcore.data.digit_pitch`, with its fifth),
each exactly two codec frames long (160 ms) and followed by one frame of silence, so every digit
starts on a frame boundary and a text has one waveform. ``init:demo`` builds the tiny random
checkpoint and fits, once, on clips of another seed (none of them a demo clip), the codec parts
the talker learns from and speaks through, frozen thereafter:

* the speech tokenizer's encoder keeps its architecture and the public names, but its
  transformer's layer scales are set to 0 (the layers pass their input through: a frame's codes
  then depend on the convolutions' receptive field, not on every earlier frame, which made a
  digit's codes depend on all the digits before it); its convolutions (SEANet, down-sampling)
  and the semantic quantizer's input projection are fitted so that a frame's projected latent
  tells that frame's spectrum (a linear probe, dropped after: a random SEANet's codes lag the
  audio by a frame and mix neighbouring digits); and its quantizers' codebooks are k-means
  centroids of the fit clips' projected latents (semantic, then each acoustic residual), so a
  code names a kind of frame;
* the way back to sound: the ported decoder (``decoder.*``) stays random (a CPU demo has no time
  for a GAN-free fit of a waveform decoder to be heard; cosyvoice3's demo HiFT stayed near
  silent), and ``speech.vocoder: griffin_lim`` stands in: each (codebook 0, codebook 1) pair's
  mean STFT magnitude over the fit clips' frames that carry it, or codebook 0's alone for a pair
  never seen (``speech_tokenizer/demo/spectra.safetensors``, 4 STFT frames per code frame),
  voiced by :func:`mmcore.data.griffin_lim`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

RATE = 24000
FRAME = 1920  # samples per 12.5 Hz codec frame
SPECTRA = "demo/spectra.safetensors"  # under speech_tokenizer/, apart from the codec's own *.safetensors
N_FFT, HOP, WIN = 1024, 480, 960  # 4 STFT frames per codec frame
FIT_CLIPS = 200
ENCODER_STEPS = 200
WER_PROMISE = 0.25  # the demo's promise: the fixed checker's WER on the held-out texts (README, tools/demo_matrix.py)


def digits_wave(digits: list[int]) -> np.ndarray:
    """A digit sentence: per digit a chord (fundamental and half as loud its fifth) of two codec
    frames under a sine envelope, then one frame of silence (float32, peak about 0.5)."""
    from mmcore.data import digit_pitch

    t = np.arange(2 * FRAME) / RATE
    envelope = np.sin(np.pi * np.arange(2 * FRAME) / (2 * FRAME))
    parts = []
    for d in digits:
        pitch = digit_pitch(d)
        parts += [envelope * (np.sin(2 * np.pi * pitch * t) + 0.5 * np.sin(3 * np.pi * pitch * t)) / 3, np.zeros(FRAME)]
    return np.concatenate(parts).astype(np.float32)


def random_digits(rng: np.random.Generator) -> list[int]:
    return [int(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 4)))]


def spectrogram(wav: Any) -> torch.Tensor:
    """bins x frames STFT magnitude (centred frames ``HOP`` apart): frame 4k + j is codec frame k's j-th."""
    wav = torch.as_tensor(wav).double().reshape(-1)
    return torch.stft(wav, N_FFT, HOP, WIN, window=torch.hann_window(WIN, dtype=torch.float64), center=True, return_complex=True).abs()


def limit_context(encoder: Any) -> None:
    """The encoder transformer's layer scales to 0: its layers pass their input through."""
    with torch.no_grad():
        for name, tensor in encoder.named_parameters():
            if name.endswith("layer_scale.scale"):
                tensor.zero_()


def fit_encoder(encoder: Any, wavs: list[np.ndarray], seed: int, steps: int = ENCODER_STEPS) -> float:
    """Fit the encoder's convolutions (SEANet, down-sampling) and the semantic quantizer's input
    projection so that a frame's projected latent tells that frame's spectrum: a linear probe to
    its 4 log-magnitude STFT frames, trained with them (MSE) and then dropped. Returns the last
    loss."""
    import torch.nn.functional as F

    from mmcore.engines import fit_demo_autoencoder

    longest = max(len(w) for w in wavs)
    batch = torch.stack([torch.from_numpy(np.pad(w, (0, longest - len(w)))) for w in wavs])
    target = torch.stack([torch.log(spectrogram(w)[:, : longest // HOP].T.reshape(longest // FRAME, -1).float() + 1e-3) for w in batch.numpy()])
    project = encoder.quantizer.semantic_residual_vector_quantizer.input_proj
    probe = torch.nn.Linear(project.out_channels, target.shape[-1])
    parts = torch.nn.ModuleDict({"encoder": encoder.encoder, "project": project, "probe": probe})
    last: dict[str, float] = {}

    def loss_of(step: int, draw: torch.Generator) -> torch.Tensor:
        pick = torch.randint(len(batch), (16,), generator=draw)
        latents = project(encoder.encoder(batch[pick][:, None]).latents).transpose(1, 2)
        loss = F.mse_loss(probe(latents), target[pick])
        last["loss"] = float(loss.detach())
        return loss

    fit_demo_autoencoder(parts, loss_of, steps=steps, lr=3e-3, seed=seed)
    return last["loss"]


def fit_quantizers(encoder: Any, latents: torch.Tensor, seed: int) -> None:
    """The codebooks in use (the semantic one, then ``num_quantizers - 1`` acoustic residual
    ones): k-means centroids of the frames' projected latents (``latents``: frames x hidden)."""
    from mmcore.engines import kmeans_codebook

    split = encoder.quantizer
    groups = ((split.semantic_residual_vector_quantizer, 1), (split.acoustic_residual_vector_quantizer, encoder.num_quantizers - 1))
    with torch.no_grad():
        for k, (rvq, count) in enumerate(groups):
            residual = rvq.input_proj(latents.T[None])[0].T if rvq.input_proj is not None else latents
            for i, layer in enumerate(rvq.layers[:count]):
                book = layer.codebook
                centroids = kmeans_codebook(residual, book.codebook_size, seed=seed * 100 + 10 * k + i)
                book.embed_sum.copy_(centroids)
                book.cluster_usage.fill_(1.0)
                book._embed = None  # transformers caches embed_sum / cluster_usage
                residual = residual - centroids[torch.cdist(residual, centroids).argmin(dim=1)]


def fit_spectra(codes: list[torch.Tensor], wavs: list[np.ndarray], size: int) -> dict[str, torch.Tensor]:
    """The voice's tables: the mean magnitude of the 4 STFT frames of the codec frames that carry
    each (codebook 0, codebook 1) pair seen (``pairs`` P x 2, ``pair_spectra`` P x 4 x bins), and
    of each codebook-0 code alone (``spectra``, codes x 4 x bins; zeros for a code no frame
    carries), for a pair never seen."""
    total: dict[tuple[int, int], torch.Tensor] = {}
    count: dict[tuple[int, int], int] = {}
    for frames, wav in zip(codes, wavs, strict=True):
        spec = spectrogram(wav)
        for k, (first, second) in enumerate(frames[:, :2].tolist()):
            part = spec[:, 4 * k : 4 * k + 4].T
            if len(part) == 4:
                total[first, second] = total.get((first, second), 0) + part
                count[first, second] = count.get((first, second), 0) + 1
    pairs = sorted(total)
    single = torch.zeros(size, FRAME // HOP, N_FFT // 2 + 1, dtype=torch.float64)
    single_count = torch.zeros(size, dtype=torch.float64)
    for first, second in pairs:
        single[first] += total[first, second]
        single_count[first] += count[first, second]
    return {
        "spectra": (single / single_count.clamp(min=1)[:, None, None]).float(),
        "pairs": torch.tensor(pairs, dtype=torch.long),
        "pair_spectra": torch.stack([total[p] / count[p] for p in pairs]).float(),
    }


def voice(codes: torch.Tensor, tables: dict[str, torch.Tensor]) -> torch.Tensor:
    """F x Q codes -> F x 1920 samples: each frame's spectrum (its codebook-0 and -1 pair's, or
    its codebook-0 code's), voiced by Griffin-Lim."""
    from mmcore.data import griffin_lim

    spectra = tables["spectra"]
    index = {tuple(p): i for i, p in enumerate(tables["pairs"].tolist())}
    frames = []
    for first, second in codes[:, :2].tolist():
        known = index.get((first, second))
        frames.append(tables["pair_spectra"][known] if known is not None else spectra[min(max(first, 0), len(spectra) - 1)])
    magnitude = torch.cat(frames).T
    # a silent STFT frame centred on the end: without it the last samples lie under the edge of a
    # single window, whose near-zero square the inverse STFT divides by, and a last frame with any
    # sound became a click that the peak normalisation turned every digit before it silent beside
    magnitude = torch.cat([magnitude, torch.zeros(len(magnitude), 1, dtype=magnitude.dtype)], dim=1)
    return griffin_lim(magnitude, N_FFT, HOP, WIN, length=len(codes) * FRAME)


def load_spectra(model_dir: Path) -> dict[str, torch.Tensor]:
    from mmcore import StageError

    path = Path(model_dir) / "speech_tokenizer" / SPECTRA
    if not path.is_file():
        raise StageError(f"{model_dir}: speech.vocoder griffin_lim needs speech_tokenizer/{SPECTRA} (the demo's code spectra; init:demo writes it), or speech.vocoder=codec")
    from safetensors.torch import load_file

    return load_file(str(path))


def build_demo_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """``init:demo``: the tiny checkpoint with the demo's encoder (context limited, codebooks
    fitted) and code spectra, as the module docstring says."""
    from safetensors.torch import load_file, save_file

    from mm_pack_qwen3tts.encoder import to_public
    from mm_pack_qwen3tts.model import load_speech_encoder
    from mm_pack_qwen3tts.tiny import build_tiny_checkpoint

    out_dir = build_tiny_checkpoint(Path(out_dir), seed=seed)
    encoder = load_speech_encoder(out_dir)
    limit_context(encoder)
    rng = np.random.default_rng(10_000 + seed)
    wavs = [digits_wave(random_digits(rng)) for _ in range(FIT_CLIPS)]
    probe_loss = fit_encoder(encoder, wavs, seed)
    with torch.no_grad():
        latents = torch.cat([encoder.encoder(torch.from_numpy(w)[None, None]).latents[0].T for w in wavs])
    fit_quantizers(encoder, latents, seed)
    codes = [encoder.encode(torch.from_numpy(w)) for w in wavs]
    tables = fit_spectra(codes, wavs, encoder.quantizer.semantic_residual_vector_quantizer.codebook_size)
    folder = out_dir / "speech_tokenizer"
    state = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if k.startswith("decoder.")}
    state.update({to_public(k): v.contiguous() for k, v in encoder.state_dict().items()})
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / SPECTRA).parent.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in tables.items()}, str(folder / SPECTRA), metadata={"kind": "qwen3tts demo code spectra", "n_fft": str(N_FFT), "hop": str(HOP), "win": str(WIN)})
    used = sorted({int(c) for frames in codes for c in frames[:, 0]})
    (out_dir / "demo_fit.json").write_text(
        json.dumps(
            {
                "fit_clips": FIT_CLIPS,
                "encoder_steps": ENCODER_STEPS,
                "probe_mse": probe_loss,
                "codebook0_codes_used": len(used),
                "code_pairs": len(tables["pairs"]),
                "frames": sum(len(c) for c in codes),
            },
            indent=1,
        )
    )
    return out_dir
