"""The demo's VQ encoder: fit at ``init:demo`` so its codes tell the demo's colours apart.

A random VQ encoder's latents hardly depend on colour (measured on the demo's pictures: of 64
codes, 1 occurred in pictures of one colour only), so neither direction could learn colour from
its codes. As the diffusion demos train their VAE at ``init:demo`` (``train_demo_vae``), this
trains the VQ encoder briefly to carry each latent cell's mean colour (a throw-away 1x1 head
regresses it from the latent; only the encoder and ``quant_conv`` are kept), then sets the
codebook to k-means centroids of the trained latents over the same pictures, so every code is
used. Pictures: the demo's shapes (``mmcore.data.shape_image``), other draws than the demo data's.
"""

from __future__ import annotations

import random
from typing import Any


def demo_pictures(image_processor: Any, count: int, seed: int) -> Any:
    import torch

    from mmcore.data import COLOURS, SHAPES, shape_image

    rng = random.Random(seed)
    pictures = [shape_image(rng.choice(SHAPES), COLOURS[rng.choice(sorted(COLOURS))], rng, size=32, radius=(9, 13)) for _ in range(count)]
    return torch.stack([image_processor(p, return_tensors="pt")["pixel_values"][0] for p in pictures])


def kmeans(points: Any, k: int, seed: int, rounds: int = 40) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    centres = points[torch.randperm(len(points), generator=g)[:k]].clone()
    for _ in range(rounds):
        nearest = torch.cdist(points, centres).argmin(1)
        for i in range(k):
            members = points[nearest == i]
            centres[i] = members.mean(0) if len(members) else points[torch.randint(len(points), (1,), generator=g)][0]
    return centres


def fit_demo_vq(vq: Any, image_processor: Any, seed: int, steps: int = 100, count: int = 192) -> dict[str, float]:
    """Train ``vq``'s encoder to keep colour, set its codebook; returns the cells' colour error and codes used."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    pixels = demo_pictures(image_processor, count, seed + 3_000)
    compression = pixels.shape[-1] // vq.config.resolution * 2 ** (len(vq.config.channel_multiplier) - 1)
    target = F.avg_pool2d(pixels, compression)  # each latent cell's mean colour, [N, 3, h, w]
    head = torch.nn.Conv2d(vq.config.embed_dim, 3, 1)
    trained = [*vq.encoder.parameters(), *vq.quant_conv.parameters(), *head.parameters()]
    optimiser = torch.optim.Adam(trained, lr=5e-3)
    vq.train()
    for step in range(steps):
        batch = torch.randint(count, (32,))
        latents = vq.quant_conv(vq.encoder(pixels[batch]))
        loss = F.mse_loss(head(latents), target[batch])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    vq.eval()
    with torch.no_grad():
        latents = vq.quant_conv(vq.encoder(pixels))
        error = float(F.mse_loss(head(latents), target))
        points = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
        vq.quantize.embedding.weight.copy_(kmeans(points, vq.quantize.embedding.weight.shape[0], seed))
        used = len(set(vq.encode(pixels).image_tokens.flatten().tolist()))
    return {"colour_mse": error, "codes_used": float(used)}
