"""BAGEL's understanding tower: SigLIP as a NaViT (images of any size at their own aspect, the
patches of several images packed in one row, attention kept inside each image), the MLP
connector into the decoder, and the fixed 2-D sin-cos position tables BAGEL adds to ViT
features and to latent tokens.

The release builds the tower from ``vit_config.json`` with ``rope: false`` and one layer fewer
than the file says (BAGEL drops SigLIP's last layer), and turns the patch convolution into a
linear layer over flattened ``(p, p, c)`` patches before loading: ``ema.safetensors`` holds
``vit_model.vision_model.embeddings.patch_embedding.weight`` as ``[hidden, p*p*3]``. Positions
index a learnt table of ``(image_size / patch)^2`` rows by ``row * max_per_side + column``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer


def sincos_2d(dim: int, side: int) -> torch.Tensor:
    """The ``[side*side, dim]`` table of MAE/DiT's 2-D sin-cos embedding: the first half of the
    channels encode the column, the second half the row, each as [sin, cos] over frequencies
    ``10000^(-k / (dim/4))``."""
    if dim % 4:
        raise ValueError(f"a 2-D sin-cos position table needs a width divisible by 4, got {dim}")
    freqs = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    coords = torch.arange(side, dtype=torch.float64)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")

    def encode(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    return torch.cat([encode(cols), encode(rows)], dim=1).float()


class PositionEmbedding(nn.Module):
    """A frozen 2-D sin-cos table indexed by flattened position ids (``vit_pos_embed``,
    ``latent_pos_embed``); the release stores it, so a checkpoint's table wins over this one."""

    def __init__(self, max_per_side: int, hidden: int) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(sincos_2d(hidden, max_per_side), requires_grad=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.pos_embed[position_ids]


class TimestepEmbedder(nn.Module):
    """DiT's timestep embedding: 256 [cos, sin] frequencies, then Linear-SiLU-Linear."""

    def __init__(self, hidden: int, frequencies: int = 256) -> None:
        super().__init__()
        self.frequencies = frequencies
        self.mlp = nn.Sequential(nn.Linear(frequencies, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequencies // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        angles = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([angles.cos(), angles.sin()], dim=-1).to(self.mlp[0].weight.dtype))


class MLPConnector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, out_dim)
        self.act = ACT2FN[act]
        self.fc2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class NaViTEmbeddings(nn.Module):
    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        p = config.patch_size
        self.patch_embedding = nn.Linear(config.num_channels * p * p, config.hidden_size)
        self.position_embedding = nn.Embedding((config.image_size // p) ** 2, config.hidden_size)

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.patch_embedding(patches) + self.position_embedding(position_ids)


class NaViTEncoder(nn.Module):
    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(config) for _ in range(config.num_hidden_layers))


class NaViTTransformer(nn.Module):
    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.embeddings = NaViTEmbeddings(config)
        self.encoder = NaViTEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor, seqlens: Sequence[int]) -> torch.Tensor:
        x = self.embeddings(patches, position_ids)[None]
        image = torch.repeat_interleave(torch.arange(len(seqlens), device=x.device), torch.as_tensor(list(seqlens), device=x.device))
        # additive mask: patches of one image attend to each other only
        mask = torch.zeros(image.numel(), image.numel(), dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(image[:, None] != image[None, :], float("-inf"))[None, None]
        for layer in self.encoder.layers:
            x = layer(x, mask)
        return self.post_layernorm(x[0])


class NaViTModel(nn.Module):
    """``vit_model``: SigLIP's ``vision_model`` over packed patches."""

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        config._attn_implementation = "sdpa"
        self.vision_model = NaViTTransformer(config)

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor, seqlens: Sequence[int]) -> torch.Tensor:
        return self.vision_model(patches, position_ids, seqlens)


def patchify(image: torch.Tensor, p: int) -> torch.Tensor:
    """``[c, h, w]`` -> ``[(h/p)*(w/p), p*p*c]``, patches row-major, each flattened as (row, col, channel)."""
    c, h, w = image.shape
    if h % p or w % p:
        raise ValueError(f"image of {h}x{w} pixels does not split into {p}-pixel patches")
    return image.reshape(c, h // p, p, w // p, p).permute(1, 3, 2, 4, 0).reshape(-1, p * p * c)


def flat_positions(h: int, w: int, max_per_side: int) -> torch.Tensor:
    """Position ids of an ``h`` x ``w`` grid in a table ``max_per_side`` wide (extrapolating:
    a grid's row r, column c is always ``r * max_per_side + c``)."""
    if h > max_per_side or w > max_per_side:
        raise ValueError(f"a {h}x{w} grid exceeds the position table's {max_per_side} per side")
    return (torch.arange(h)[:, None] * max_per_side + torch.arange(w)[None]).flatten()
