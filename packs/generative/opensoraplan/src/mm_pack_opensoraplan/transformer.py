"""``OpenSoraPlanTransformer3DModel``: the sparse U-shaped MMDiT of Open-Sora Plan v1.5 as a
diffusers model (``from_pretrained`` / ``save_pretrained``, config fields the reference's).

The blocks and attention are in :mod:`.model`; here the U: the patch embedding, the timestep and
pooled-CLIP conditioning, the T5 caption projection, the stages with their skip connections,
the 3D RoPE, and the AdaNorm head.
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

from mm_pack_opensoraplan.model import FeedForward, NormZero, SparseMMAttention, clamp_fp16, make_norm, rope_tables, sparse_1d


class SparseMMDiTBlock(nn.Module):
    def __init__(
        self, dim: int, heads: int, head_dim: int, cond_dim: int, eps: float, norm_cls: str, activation_fn: str, bias: bool, double_ff: bool, context_pre_only: bool, sparse_n: int, sparse_group: bool
    ) -> None:
        super().__init__()
        self.sparse_n, self.sparse_group, self.double_ff, self.context_pre_only = sparse_n, sparse_group, double_ff, context_pre_only
        self.norm1 = NormZero(cond_dim, dim, eps, norm_cls)
        self.attn1 = SparseMMAttention(dim, heads, head_dim, bias, eps, context_pre_only, sparse_n, sparse_group)
        self.norm2 = NormZero(cond_dim, dim, eps, norm_cls, with_text=double_ff or not context_pre_only)
        self.ff = FeedForward(dim, activation_fn)
        self.ff_enc = FeedForward(dim, activation_fn) if double_ff else None

    def forward(self, x: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, keep: torch.Tensor, rope: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = x.dtype
        x, text = clamp_fp16(x, self.training), clamp_fp16(text, self.training)
        nx, ntext, gate, t_gate = self.norm1(x, text, temb)
        ax, atext = self.attn1(nx, ntext, keep, rope)
        x = (x.float() + gate * ax.float()).to(dtype)
        if not self.context_pre_only:
            text = clamp_fp16((text.float() + t_gate * atext.float()).to(dtype), self.training)
        x = clamp_fp16(x, self.training)
        nx, ntext, gate, t_gate = self.norm2(x, text, temb)
        x = (x.float() + gate * self.ff(nx).float()).to(dtype)
        if not self.context_pre_only:  # one FFN for both streams unless double_ff (it is token-wise)
            ff = self.ff_enc if self.ff_enc is not None else self.ff
            text = (text.float() + t_gate * ff(ntext).float()).to(dtype)
        return x, text


class AdaNorm(nn.Module):
    """The head's modulation: ``norm`` then scale and shift from the conditioning (``linear``)."""

    def __init__(self, cond_dim: int, dim: int, eps: float, norm_cls: str) -> None:
        super().__init__()
        self.linear = nn.Linear(cond_dim, 2 * dim)
        self.norm = make_norm(norm_cls, dim, eps)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = self.linear(F.silu(temb).to(self.linear.weight.dtype)).float().chunk(2, dim=1)  # the conditioning is float32
        return (self.norm(x).float() * (1 + scale[:, None]) + shift[:, None]).to(x.dtype)


class TimeTextEmbedding(nn.Module):
    """Sinusoidal timestep -> MLP, plus the pooled CLIP vector's projection, in float32."""

    def __init__(self, dim: int, pooled_dim: int) -> None:
        super().__init__()
        self.time_proj = Timesteps(num_channels=dim, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.timestep_embedder = TimestepEmbedding(in_channels=dim, time_embed_dim=dim)
        self.text_embedder = PixArtAlphaTextProjection(pooled_dim, dim, act_fn="silu")

    def forward(self, timestep: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        t = self.timestep_embedder(self.time_proj(timestep).to(pooled.dtype))
        return t.float() + self.text_embedder(pooled).float()


class PatchEmbed2D(nn.Module):
    def __init__(self, patch: int, channels: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x = self.proj(x.transpose(1, 2).flatten(0, 1))  # (b t) d h' w'
        return x.unflatten(0, (b, -1)).permute(0, 1, 3, 4, 2).flatten(1, 3)  # b (t h' w') d


def skip_linear(dim: int, zero_init: bool, eps: float, norm_cls: str) -> nn.Sequential:
    linear = nn.Linear(2 * dim, dim)
    if zero_init:  # identity on the main path, zero on the skip: the U starts as a plain stack
        with torch.no_grad():
            linear.weight.zero_()
            linear.weight[:, :dim] = torch.eye(dim)
            linear.bias.zero_()
    return nn.Sequential(nn.Identity() if zero_init else make_norm(norm_cls, 2 * dim, eps), linear)


class OpenSoraPlanTransformer3DModel(ModelMixin, ConfigMixin, PeftAdapterMixin):
    """Open-Sora Plan v1.5's ``SparseUMMDiT`` (8B: ``num_layers`` [2, 4, 6, 8, 6, 4, 2], 24 heads of 128)."""

    _supports_gradient_checkpointing = True
    _no_split_modules = ["SparseMMDiTBlock"]

    @register_to_config
    def __init__(
        self,
        num_heads: int = 24,
        head_dim: int = 128,
        in_channels: int = 32,
        out_channels: int | None = 32,
        num_layers: tuple[int, ...] = (2, 4, 6, 8, 6, 4, 2),
        sparse_n: tuple[int, ...] = (1, 2, 4, 8, 4, 2, 1),
        double_ff: bool = True,
        sparse1d: bool = True,
        dropout: float = 0.0,
        attention_bias: bool = True,
        patch_size_thw: tuple[int, int, int] = (1, 2, 2),
        activation_fn: str = "gelu-approximate",
        norm_elementwise_affine: bool = True,
        norm_eps: float = 1e-6,
        norm_cls: str = "fp32_layer_norm",
        caption_channels: int = 2048,
        pooled_projection_dim: int = 1280,
        timestep_embed_dim: int = 1024,
        interpolation_scale_t: float = 1.0,
        interpolation_scale_h: float = 1.0,
        interpolation_scale_w: float = 1.0,
        skip_connection: bool = True,
        skip_connection_zero_init: bool = True,
        explicit_uniform_rope: bool = False,
        sample_size_t: int | None = None,
        sample_size_h: int | None = None,
        sample_size_w: int | None = None,
    ) -> None:
        super().__init__()
        if len(num_layers) != len(sparse_n) or len(num_layers) % 2 != 1 or any(n % 2 for n in num_layers):
            raise ValueError(f"num_layers {list(num_layers)} / sparse_n {list(sparse_n)}: an odd number of stages, each of an even number of blocks, a sparse_n per stage")
        if head_dim % 16:
            raise ValueError(f"head_dim={head_dim}: Open-Sora Plan's 3D RoPE splits heads in sixteenths")
        if patch_size_thw[0] != 1:
            raise ValueError(f"patch_size_thw={list(patch_size_thw)}: the v1.5 model patches 1 frame at a time")
        if explicit_uniform_rope:
            raise ValueError("explicit_uniform_rope=true (random RoPE offsets in training) is not implemented in this pack")
        dim, out = num_heads * head_dim, out_channels or in_channels
        self.sparse = [n if sparse1d else 1 for n in sparse_n]
        self.gradient_checkpointing = False
        self.patch_embed = PatchEmbed2D(patch_size_thw[1], in_channels, dim)
        self.time_text_embed = TimeTextEmbedding(timestep_embed_dim, pooled_projection_dim)
        self.caption_projection = nn.Linear(caption_channels, dim)
        stages, last = [], len(num_layers) - 1
        for idx, (count, n) in enumerate(zip(num_layers, self.sparse)):
            blocks = []
            for i in range(count):
                end = idx == last and i == count - 1  # the last block: the text stream ends before its output
                blocks.append(SparseMMDiTBlock(dim, num_heads, head_dim, timestep_embed_dim, norm_eps, norm_cls, activation_fn, attention_bias, double_ff and not end, end, n, n > 1 and i % 2 == 1))
            stages.append(nn.ModuleList(blocks))
        self.transformer_blocks = nn.ModuleList(stages)
        if skip_connection:
            ups = len(num_layers) // 2
            self.skip_norm_linear = nn.ModuleList(skip_linear(dim, skip_connection_zero_init, norm_eps, norm_cls) for _ in range(ups))
            self.skip_norm_linear_enc = nn.ModuleList(skip_linear(dim, skip_connection_zero_init, norm_eps, norm_cls) for _ in range(ups))
        self.norm_final = make_norm(norm_cls, dim, norm_eps)
        self.norm_out = AdaNorm(timestep_embed_dim, dim, norm_eps, norm_cls)
        self.proj_out = nn.Linear(dim, patch_size_thw[0] * patch_size_thw[1] ** 2 * out)

    @property
    def blocks(self) -> list[nn.Module]:
        """Every block of every stage, in order (what FSDP shards one by one)."""
        return [block for stage in self.transformer_blocks for block in stage]

    def rope(self, frames: int, height: int, width: int, device: Any) -> tuple[torch.Tensor, ...]:
        """cos, sin of the frame, row and column of every token (t, h, w order), per RoPE band."""
        c = self.config
        d_t, d = c.head_dim // 16 * 4, c.head_dim // 16 * 6
        grid = torch.cartesian_prod(torch.arange(frames, device=device), torch.arange(height, device=device), torch.arange(width, device=device))
        scales = (c.interpolation_scale_t, c.interpolation_scale_h, c.interpolation_scale_w)
        return tuple(t for axis, band in enumerate((d_t, d, d)) for t in rope_tables(band, grid[:, axis], scales[axis]))

    def masks(self, video_keep: torch.Tensor, text_keep: torch.Tensor) -> dict[tuple[int, bool], torch.Tensor]:
        """Attention masks per (sparse_n, group): [k B, 1, 1, video keys + text keys], True = attend."""
        out = {}
        for n in set(self.sparse):
            for group in (False, True) if n > 1 else (False,):
                video = sparse_1d(video_keep[..., None].float(), n, group)[..., 0] > 0.5 if n > 1 else video_keep
                out[n, group] = torch.cat([video, text_keep.repeat(n, 1)], dim=1)[:, None, None]
        return out

    def run_block(self, block: nn.Module, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            return self._gradient_checkpointing_func(block, *args)
        return block(*args)

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        pooled_projections: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> Any:
        """``hidden_states`` [B, C, F, H, W], ``timestep`` [B] (sigma x 1000), ``encoder_hidden_states``
        [B, L, caption_channels] (T5), ``pooled_projections`` [B, pooled_projection_dim] (CLIP),
        masks 1 = attend (``encoder_attention_mask`` [B, L], ``attention_mask`` [B, F, H, W])."""
        c = self.config
        b, _, frames, height, width = hidden_states.shape
        p = c.patch_size_thw[1]
        h, w = height // p, width // p
        if attention_mask is None:
            video_keep = torch.ones(b, frames * h * w, dtype=torch.bool, device=hidden_states.device)
        else:  # a patch is attended where any of its latents is
            video_keep = F.max_pool3d(attention_mask[:, None].float(), (1, p, p), (1, p, p)).flatten(1) > 0
        text_keep = torch.ones(encoder_hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device) if encoder_attention_mask is None else encoder_attention_mask.bool()
        masks = self.masks(video_keep, text_keep)
        x = self.patch_embed(hidden_states.to(self.dtype))
        temb = self.time_text_embed(timestep, pooled_projections.to(self.dtype))
        text = self.caption_projection(encoder_hidden_states.to(self.dtype))
        rope = self.rope(frames, h, w, x.device)
        half, skips = len(c.num_layers) // 2, []
        for idx, stage in enumerate(self.transformer_blocks):
            if c.skip_connection and idx > half:
                sx, stext = skips.pop()
                x = self.skip_norm_linear[idx - half - 1](torch.cat([x, sx], dim=-1))
                text = self.skip_norm_linear_enc[idx - half - 1](torch.cat([text, stext], dim=-1))
            for block in stage:
                x, text = self.run_block(block, x, text, temb, masks[block.sparse_n, block.sparse_group], rope)
            if idx < half:
                skips.append((x, text))
        x = self.proj_out(self.norm_out(self.norm_final(x), temb))
        out = c.out_channels or c.in_channels
        x = x.reshape(b, frames, h, w, p, p, out).permute(0, 6, 1, 2, 4, 3, 5).reshape(b, out, frames, h * p, w * p)
        return Transformer2DModelOutput(sample=x) if return_dict else (x,)
