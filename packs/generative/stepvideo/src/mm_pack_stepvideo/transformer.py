"""``StepVideoTransformer3DModel``: Step-Video-T2V's DiT (the reference's ``StepVideoModel``) as a
diffusers model (``from_pretrained`` / ``save_pretrained`` / LoRA), single-device code under the
released checkpoint's parameter names and config fields.

Per block: AdaLN-single modulated LayerNorm -> self-attention over every video token (fused
``wqkv``, per-head RMS q/k norm, 3D RoPE) -> gated residual; cross-attention to the text
(``wq``, fused ``wkv``, RMS q/k norm, no gate, no norm before it); modulated LayerNorm -> GELU(tanh)
FFN -> gated residual. Text: Step-LLM's states through a non-affine LayerNorm and a PixArt caption
projection, HunyuanCLIP's states through ``clip_projection``, concatenated CLIP first.

The reference's conventions, kept here: ``timestep`` is the flow's time in [0, 1] with 0 = noise
and 1 = data (``adaln_single`` multiplies it by 1000), and the output is the velocity
``data - noise``; ``encoder_attention_mask`` covers CLIP's tokens then Step-LLM's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.loaders import PeftAdapterMixin
from diffusers.models.embeddings import PixArtAlphaTextProjection, TimestepEmbedding, Timesteps
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn


class RMSNorm(nn.Module):
    """The reference's: normalised in float32, cast back, then scaled."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(dim: int, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, dim] of 1D RoPE (base 1e4, halves rotated) at integer ``positions`` [N]; the
    angles cast to ``dtype`` before cos / sin, as the reference does."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=positions.device).float() / dim))
    freqs = (positions.float()[:, None] * inv_freq[None]).to(dtype)
    freqs = torch.cat([freqs, freqs], dim=-1)
    return freqs.cos(), freqs.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope_3d(x: torch.Tensor, grid: tuple[int, int, int], split: tuple[int, ...]) -> torch.Tensor:
    """``x`` [B, S, heads, head_dim] of the tokens of a (frames, height, width) grid in that order:
    the first ``split[0]`` channels rotated by the frame index, the next by the row, the last by
    the column."""
    f, h, w = grid
    mesh = torch.cartesian_prod(torch.arange(f), torch.arange(h), torch.arange(w)).to(x.device)
    out = []
    for axis, part in enumerate(torch.split(x, list(split), dim=-1)):
        cos, sin = rope_tables(part.shape[-1], mesh[:, axis], x.dtype)
        out.append(part * cos[None, :, None] + rotate_half(part) * sin[None, :, None])
    return torch.cat(out, dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, S, heads, d] each -> [B, S, heads * d]; ``mask`` [B, 1, 1, keys] True = attend."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, head_dim: int, rope_split: tuple[int, ...]) -> None:
        super().__init__()
        self.head_dim, self.heads, self.rope_split = head_dim, dim // head_dim, tuple(rope_split)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)

    def forward(self, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        # the fused projection is per head [q_h, k_h, v_h] (the released layout), not [q; k; v]
        q, k, v = self.wqkv(x).view(*x.shape[:-1], self.heads, 3 * self.head_dim).split(self.head_dim, dim=-1)
        q = apply_rope_3d(self.q_norm(q), grid, self.rope_split)
        k = apply_rope_3d(self.k_norm(k), grid, self.rope_split)
        return self.wo(attention(q, k, v))


class CrossAttention(nn.Module):
    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim, self.heads = head_dim, dim // head_dim
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wkv = nn.Linear(dim, 2 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)

    def forward(self, x: torch.Tensor, text: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q = self.wq(x).view(*x.shape[:-1], self.heads, self.head_dim)
        k, v = self.wkv(text).view(*text.shape[:-1], self.heads, 2 * self.head_dim).split(self.head_dim, dim=-1)
        return self.wo(attention(self.q_norm(q), self.k_norm(k), v, mask))


class GELUProj(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """``net.0.proj`` (GELU, tanh), ``net.1`` (nothing), ``net.2``: the released names."""

    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.net = nn.ModuleList([GELUProj(dim, inner), nn.Identity(), nn.Linear(inner, dim, bias=False)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.net:
            x = layer(x)
        return x


class StepVideoTransformerBlock(nn.Module):
    def __init__(self, dim: int, head_dim: int, rope_split: tuple[int, ...], eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn1 = SelfAttention(dim, head_dim, rope_split)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.attn2 = CrossAttention(dim, head_dim)
        self.ff = FeedForward(dim, 4 * dim)
        self.scale_shift_table = nn.Parameter(torch.randn(6, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, mask: torch.Tensor | None, grid: tuple[int, int, int]) -> torch.Tensor:
        mods = (self.scale_shift_table[None] + temb.reshape(-1, 6, self.dim)).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
        x = gate_msa * self.attn1(self.norm1(x) * (1 + scale_msa) + shift_msa, grid) + x
        x = self.attn2(x, text, mask) + x
        return gate_mlp * self.ff(self.norm2(x) * (1 + scale_mlp) + shift_mlp) + x


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, channels: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> [N, (H / p) (W / p), dim]."""
        return self.proj(frames).flatten(2).transpose(1, 2)


class CombinedTimestepEmbedding(nn.Module):
    """PixArt's timestep embedding, with Step-Video's optional resolution / frame count / fps terms."""

    def __init__(self, dim: int, additional: bool) -> None:
        super().__init__()
        self.time_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.timestep_embedder = TimestepEmbedding(256, dim)
        self.additional = additional
        if additional:
            self.additional_condition_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
            self.resolution_embedder = TimestepEmbedding(256, dim // 2)
            self.nframe_embedder = TimestepEmbedding(256, dim)
            self.fps_embedder = TimestepEmbedding(256, dim)

    def embed(self, embedder: nn.Module, values: torch.Tensor, batch: int, dtype: torch.dtype) -> torch.Tensor:
        return embedder(self.additional_condition_proj(values.flatten()).to(dtype)).reshape(batch, -1)

    def forward(self, timestep: torch.Tensor, resolution: Any = None, nframe: Any = None, fps: Any = None) -> torch.Tensor:
        dtype = self.timestep_embedder.linear_1.weight.dtype
        emb = self.timestep_embedder(self.time_proj(timestep).to(dtype))
        if self.additional:
            b = timestep.shape[0]
            emb = emb + self.embed(self.resolution_embedder, resolution, b, dtype) + self.embed(self.nframe_embedder, nframe, b, dtype)
            if fps is not None:
                emb = emb + self.embed(self.fps_embedder, fps, b, dtype)
        return emb


class AdaLayerNormSingle(nn.Module):
    def __init__(self, dim: int, additional: bool, rescale: float = 1000.0) -> None:
        super().__init__()
        self.emb = CombinedTimestepEmbedding(dim, additional)
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, 6 * dim)
        self.rescale = rescale

    def forward(self, timestep: torch.Tensor, **conditions: Any) -> tuple[torch.Tensor, torch.Tensor]:
        embedded = self.emb(timestep * self.rescale, **conditions)
        return self.linear(self.silu(embedded)), embedded


class StepVideoTransformer3DModel(ModelMixin, ConfigMixin, PeftAdapterMixin):
    """Step-Video-T2V's DiT (30B defaults: 48 blocks, 48 heads of 128, 64 latent channels)."""

    _supports_gradient_checkpointing = True
    _no_split_modules = ["StepVideoTransformerBlock", "PatchEmbed"]

    @register_to_config
    def __init__(
        self,
        num_attention_heads: int = 48,
        attention_head_dim: int = 128,
        in_channels: int = 64,
        out_channels: int | None = 64,
        num_layers: int = 48,
        dropout: float = 0.0,
        patch_size: int = 1,
        norm_type: str = "ada_norm_single",
        norm_elementwise_affine: bool = False,
        norm_eps: float = 1e-6,
        use_additional_conditions: bool = False,
        caption_channels: int | tuple[int, int] = (6144, 1024),
        attention_type: str = "parallel",
        rope_split: tuple[int, int, int] | None = None,
    ) -> None:
        super().__init__()
        # attention_type: the reference's choice of sequence-parallel (xDiT) or torch attention;
        # here always single-device SDPA. rope_split: this pack's addition (the reference fixes
        # [64, 32, 32], which needs heads of 128); None means that.
        split = tuple(rope_split or (64, 32, 32))
        if sum(split) != attention_head_dim or any(s % 2 for s in split):
            raise ValueError(f"rope_split {list(split)} must be three even bands summing to attention_head_dim={attention_head_dim}")
        if norm_elementwise_affine:
            raise ValueError("norm_elementwise_affine=true: the released model's caption and output norms have no weights; not supported")
        dim = num_attention_heads * attention_head_dim
        self.inner_dim, self.out_channels, self.patch_size = dim, out_channels or in_channels, patch_size
        self.gradient_checkpointing = False
        self.pos_embed = PatchEmbed(patch_size, in_channels, dim)
        self.transformer_blocks = nn.ModuleList(StepVideoTransformerBlock(dim, attention_head_dim, split) for _ in range(num_layers))
        self.norm_out = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False)
        self.scale_shift_table = nn.Parameter(torch.randn(2, dim) / dim**0.5)
        self.proj_out = nn.Linear(dim, patch_size * patch_size * self.out_channels)
        self.adaln_single = AdaLayerNormSingle(dim, use_additional_conditions)
        if isinstance(caption_channels, int):
            llm_dim = caption_channels
        else:
            llm_dim, clip_dim = caption_channels
            self.clip_projection = nn.Linear(clip_dim, dim)
        self.caption_norm = nn.LayerNorm(llm_dim, eps=norm_eps, elementwise_affine=False)
        self.caption_projection = PixArtAlphaTextProjection(llm_dim, dim, act_fn="gelu_tanh")

    @property
    def blocks(self) -> nn.ModuleList:
        """The block list FSDP shards one by one."""
        return self.transformer_blocks

    def run_block(self, block: nn.Module, *args: Any) -> torch.Tensor:
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            return self._gradient_checkpointing_func(block, *args)
        return block(*args)

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_2: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        fps: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> Any:
        """``hidden_states`` [B, C, F, H, W] (diffusers' order; the reference takes [B, F, C, H, W]),
        ``timestep`` [B] in [0, 1] (0 = noise), ``encoder_hidden_states`` [B, L, 6144] (Step-LLM),
        ``encoder_hidden_states_2`` [B, L2, 1024] (HunyuanCLIP), ``encoder_attention_mask``
        [B, L2 + L] (1 = attend; CLIP's tokens first). Returns the velocity (data - noise), [B, C, F, H, W]."""
        b, _, frames, height, width = hidden_states.shape
        p = self.patch_size
        h, w = height // p, width // p
        x = self.pos_embed(hidden_states.transpose(1, 2).flatten(0, 1).to(self.dtype))  # [(B F), h w, D]
        x = x.reshape(b, frames * h * w, self.inner_dim)
        conditions = {}
        if self.config.use_additional_conditions:
            conditions = {
                "resolution": torch.tensor([(h, w)] * b, device=x.device, dtype=x.dtype),
                "nframe": torch.tensor([frames] * b, device=x.device, dtype=x.dtype),
                "fps": fps,
            }
        temb, embedded = self.adaln_single(timestep, **conditions)
        text = self.caption_projection(self.caption_norm(encoder_hidden_states.to(self.dtype)))
        if encoder_hidden_states_2 is not None and hasattr(self, "clip_projection"):
            text = torch.cat([self.clip_projection(encoder_hidden_states_2.to(self.dtype)), text], dim=1)
        mask = None if encoder_attention_mask is None else encoder_attention_mask.bool()[:, None, None, : text.shape[1]]
        for block in self.transformer_blocks:
            x = self.run_block(block, x, text, temb, mask, (frames, h, w))
        shift, scale = (self.scale_shift_table[None] + embedded[:, None]).chunk(2, dim=1)
        x = self.proj_out(self.norm_out(x) * (1 + scale) + shift)
        c = self.out_channels
        x = x.reshape(b, frames, h, w, p, p, c).permute(0, 6, 1, 2, 4, 3, 5).reshape(b, c, frames, h * p, w * p)
        return Transformer2DModelOutput(sample=x) if return_dict else (x,)
