"""A tiny VAE that reconstructs a demo's frames: trained briefly, at ``init:demo``, on the
pack's own synthetic clips (:func:`train_demo_vae`).

A random VAE cannot reconstruct even a training clip, so whatever a demo's denoiser learns
decodes to coloured static. A few hundred steps of reconstruction on the demo's kind of clips
(seeded: one machine builds the same VAE every time) give a VAE whose decoded samples show
what the denoiser made, and a held-out PSNR that says how well it can. The latents'
normalisation the pipeline applies (``latents_mean``/``latents_std``, ``scaling_factor``,
``shift_factor``) is then set from the trained VAE's own latent statistics, as the released
checkpoints' are, so the denoiser sees latents of unit spread.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

#: the file beside a pipeline's folders that states its demo VAE's training and reconstruction
DEMO_VAE_FILE = "demo_vae.json"


def _pixels(clips: Any, image: bool) -> Any:
    """uint8 [N, F, H, W, 3] -> float [N, 3, F, H, W] in [-1, 1] ([N, 3, H, W] for an image VAE)."""
    import numpy as np
    import torch

    x = torch.from_numpy(np.ascontiguousarray(np.stack(list(clips)))).float() / 127.5 - 1.0
    x = x.permute(0, 4, 1, 2, 3)
    return x[:, :, 0] if image else x


def _drawn(x: Any) -> Any:
    """Where ``x`` (pixels in [-1, 1], channels on dim 1) is drawn: the pixels that are not white (the shapes)."""
    return (1.0 - x).amax(1, keepdim=True) > 0.1


def _psnr(vae: Any, x: Any, batch: int) -> tuple[float, float]:
    """Mean PSNR (dB, pixels in [0, 1]) of the posterior mode's reconstructions of ``x``, and the
    PSNR over its drawn pixels only (the shapes: a VAE that draws every shape in their mean
    colour scores well on the first, badly on this)."""
    import torch

    scores, drawn_error, drawn_count = [], 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            clean = x[i : i + batch]
            out = vae.decode(vae.encode(clean).latent_dist.mode()).sample.clamp(-1, 1)
            error = ((out - clean) / 2).pow(2)
            scores += (10 * torch.log10(1 / error.flatten(1).mean(1).clamp_min(1e-10))).tolist()
            drawn = _drawn(clean).expand_as(clean)
            drawn_error, drawn_count = drawn_error + float(error[drawn].sum()), drawn_count + int(drawn.sum())
    drawn_psnr = 10 * math.log10(1 / max(drawn_error / max(drawn_count, 1), 1e-10))
    return float(sum(scores) / len(scores)), drawn_psnr


def train_demo_vae(
    vae: Any, clips: Any, held_out: Any, *, steps: int = 300, lr: float = 2e-3, batch: int = 8, seed: int = 0, kl_weight: float = 1e-6, shape_weight: float = 10.0, frame_steps: int = 0
) -> dict[str, Any]:
    """Train ``vae`` (a diffusers ``AutoencoderKL``, ``AutoencoderKLWan``, ``AutoencoderKLCogVideoX``,
    ``AutoencoderKLHunyuanVideo``...) in place to reconstruct ``clips`` (uint8 [N, F, H, W, 3];
    an image VAE takes each clip's first frame): ``steps`` of AdamW on the squared error of the
    posterior mode's decoding (``shape_weight`` times as much on pixels that are not white: the
    shapes, a small part of each frame, are what a demo is about) plus ``kl_weight`` x KL,
    batches drawn from ``seed``; the first ``frame_steps`` of a video VAE on single frames (4 x
    ``batch`` of them, drawn from the clips): colour and shape are learnt there at a ninth of the
    cost, motion after. Then set
    the normalisation its pipeline applies from the latents' statistics over ``clips``
    (:func:`set_latent_normalisation`) and return what it measured: ``reconstruction_psnr`` on
    ``held_out`` clips (dB) and ``drawn_psnr`` over their drawn pixels, ``train_psnr`` and
    ``train_drawn_psnr`` on as many training clips, the latents' mean and spread, steps, seconds."""
    import torch

    start = time.perf_counter()
    image = vae.encoder.conv_in.weight.dim() == 4 if hasattr(vae.encoder.conv_in, "weight") else False
    x, held = _pixels(clips, image), _pixels(held_out, image)

    def loss_of(step: int, draw: Any) -> Any:
        chosen = x[torch.randint(len(x), (min(batch, len(x)),), generator=draw)]
        if step < frame_steps and not image:  # single frames first: a causal video VAE encodes a clip's first frame alone, 9x cheaper
            chosen = chosen.transpose(1, 2).flatten(0, 1)[torch.randint(len(chosen) * chosen.shape[2], (4 * len(chosen),), generator=draw)][:, :, None]
        posterior = vae.encode(chosen).latent_dist
        out = vae.decode(posterior.mode()).sample  # the mode, as the pipelines encode: a fresh VAE's posterior noise would drown its latents
        weight = 1.0 + (shape_weight - 1.0) * _drawn(chosen)  # the drawn pixels count more than the white ground
        return (weight * (out - chosen).pow(2)).mean() + kl_weight * posterior.kl().mean()

    fit_demo_autoencoder(vae, loss_of, steps=steps, lr=lr, seed=seed)
    with torch.no_grad():
        latents = torch.cat([vae.encode(x[i : i + batch]).latent_dist.mode() for i in range(0, len(x), batch)])
    channels = latents.transpose(0, 1).flatten(1)
    set_latent_normalisation(vae, channels.mean(1), channels.std(1), float(latents.mean()), float(latents.std()))
    (psnr, drawn_psnr), (train_psnr, train_drawn_psnr) = _psnr(vae, held, batch), _psnr(vae, x[: len(held)], batch)
    return {
        "reconstruction_psnr": round(psnr, 2),
        "drawn_psnr": round(drawn_psnr, 2),
        "train_psnr": round(train_psnr, 2),
        "train_drawn_psnr": round(train_drawn_psnr, 2),
        "latents_mean": round(float(latents.mean()), 4),
        "latents_std": round(float(latents.std()), 4),
        "clips": len(x),
        "held_out_clips": len(held),
        "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
    }


def train_demo_vae_until(make_vae: Any, clips: Any, held_out: Any, *, drawn_psnr_floor: float, tries: int = 3, seed: int = 0, **options: Any) -> tuple[Any, dict[str, Any]]:
    """:func:`train_demo_vae` on ``make_vae(0)``, and again on a fresh ``make_vae(k)`` (fitted
    from seed ``seed + 1000 k``) while its ``train_drawn_psnr`` is below ``drawn_psnr_floor``,
    ``tries`` fits at most: the fit of a small VAE sometimes settles on drawing every shape in
    their mean colour (a seed's float rounding decides it; more steps do not leave it), and a
    demo whose VAE cannot show colour cannot show its caption. The floor is judged on training
    clips, so the held-out figures stay held out. Returns the first fit at the floor, or where
    none reaches it the one nearest it, and its figures, with ``tries`` (how many fits),
    ``kept`` (which, from 1) and ``drawn_psnr_floor``."""
    kept: tuple[int, Any, dict[str, Any]] | None = None
    for attempt in range(tries):
        vae = make_vae(attempt)
        measured = train_demo_vae(vae, clips, held_out, seed=seed + 1000 * attempt, **options)
        if kept is None or measured["train_drawn_psnr"] > kept[2]["train_drawn_psnr"]:
            kept = (attempt, vae, measured)  # a fit at the floor is above every earlier one, all below it
        if measured["train_drawn_psnr"] >= drawn_psnr_floor:
            break
    assert kept is not None, "tries must be at least 1"
    return kept[1], {**kept[2], "tries": attempt + 1, "kept": kept[0] + 1, "drawn_psnr_floor": drawn_psnr_floor}


def fit_demo_autoencoder(module: Any, loss_of: Any, *, steps: int, lr: float, seed: int) -> None:
    """Train a demo's autoencoder ``module`` in place, the one schedule every demo VAE gets:
    ``steps`` of AdamW (no weight decay) at ``lr``, warmed up over 20 steps and decayed linearly
    to a tenth, gradients clipped at 1, on ``loss_of(step, draw)`` -- the step's loss, its
    batch drawn from ``draw`` (a generator seeded with ``seed``; torch's global RNG is seeded
    with it too, for the posterior's noise). Leaves ``module`` in eval mode."""
    import torch

    torch.manual_seed(seed)
    draw = torch.Generator().manual_seed(seed)
    module.train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20) * (0.1 + 0.9 * (1 - s / steps)))
    for step in range(steps):
        loss = loss_of(step, draw)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    module.eval()


def set_latent_normalisation(vae: Any, channel_mean: Any, channel_std: Any, mean: float, std: float) -> None:
    """Set the latents' normalisation ``vae``'s pipeline applies from their statistics: per
    channel ``latents_mean``/``latents_std`` where the config has them (Wan), or where the VAE
    keeps them as buffers of that size (LTX-Video, LTX-2's video VAE: saved with its weights,
    ``scaling_factor`` left as it is); else ``shift_factor`` = mean and ``scaling_factor`` =
    1/std where the config has a shift (FLUX); else ``scaling_factor`` = 1/root mean square
    (CogVideoX, HunyuanVideo)."""
    import torch

    config = vae.config
    if getattr(config, "latents_mean", None) is not None and getattr(config, "latents_std", None) is not None:
        vae.register_to_config(latents_mean=[round(float(v), 5) for v in channel_mean], latents_std=[round(float(v), 5) for v in channel_std])
        return
    buffers = dict(vae.named_buffers())
    if "latents_mean" in buffers and "latents_std" in buffers and buffers["latents_mean"].shape == torch.as_tensor(channel_mean).shape:
        buffers["latents_mean"].copy_(torch.as_tensor(channel_mean, dtype=buffers["latents_mean"].dtype))
        buffers["latents_std"].copy_(torch.as_tensor(channel_std, dtype=buffers["latents_std"].dtype))
        return
    if getattr(config, "shift_factor", None) is not None:  # latents = (z - shift) * scale
        vae.register_to_config(shift_factor=round(mean, 5), scaling_factor=round(1.0 / max(std, 1e-6), 5))
        return
    rms = (std * std + mean * mean) ** 0.5  # latents = z * scale: unit root mean square
    vae.register_to_config(scaling_factor=round(1.0 / max(rms, 1e-6), 5))


def write_demo_vae_report(folder: Path, measured: dict[str, Any]) -> Path:
    """``measured`` (:func:`train_demo_vae`'s) as ``folder/demo_vae.json``: what evaluate reports as
    ``reconstruction_psnr``."""
    out = Path(folder) / DEMO_VAE_FILE
    out.write_text(json.dumps(measured, indent=1) + "\n")
    return out


def demo_vae_report(folder: Path) -> dict[str, Any] | None:
    """The demo VAE's report in a pipeline folder, or None (a VAE not trained here)."""
    path = Path(folder) / DEMO_VAE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


__all__ = ["DEMO_VAE_FILE", "train_demo_vae", "train_demo_vae_until", "set_latent_normalisation", "write_demo_vae_report", "demo_vae_report"]


def kmeans_codebook(points: Any, size: int, seed: int, iterations: int = 30) -> Any:
    """A demo codebook of ``size`` centroids fitted to ``points`` (torch, N x D) by k-means: a
    k-means++ start drawn from a generator seeded with ``seed``, then ``iterations`` rounds of
    Lloyd's (a centroid no point chose keeps its place). Deterministic on one machine and thread
    count; for the demo tokenizers and codecs fitted once at ``init:demo``."""
    import torch

    points = torch.as_tensor(points).float()
    draw = torch.Generator().manual_seed(seed)
    centroids = points[torch.randint(len(points), (1,), generator=draw)]
    while len(centroids) < size:
        gap = torch.cdist(points, centroids).min(dim=1).values ** 2
        centroids = torch.cat([centroids, points[torch.multinomial(gap + 1e-12, 1, generator=draw)]])
    for _ in range(iterations):
        chosen = torch.cdist(points, centroids).argmin(dim=1)
        for k in range(size):
            members = points[chosen == k]
            if len(members):
                centroids[k] = members.mean(dim=0)
    return centroids
