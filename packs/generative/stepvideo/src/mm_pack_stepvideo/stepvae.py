"""Step-Video-T2V's Video-VAE (stepfun-ai/Step-Video-T2V ``stepvideo/vae/vae.py``
``AutoencoderKL``), single-device torch code as a diffusers ``ModelMixin``.

The released ``vae/vae_v2.safetensors`` is version 2 with 64 latent channels: 16x compression of
rows and columns, 8x of time, clips in groups of 17 frames (3 latent frames each). The encoder is
causal 3-D convolutions (3 spatial halvings, 2 of them also in time), a causal attention block,
then a space-time-to-channels step (2x2x2) with an averaged shortcut; the decoder mirrors it
(channels-to-space-time with a duplicated shortcut, 2 space-time and 1 spatial doubling) and
drops its first 3 frames. Version 2 normalises per frame; version 1 (``vae.safetensors``, 16
channels, 8x8 spatially, 4x in time, 5 latent frames a group) over the clip.

Config fields are the reference's constructor arguments: ``AutoencoderKL``'s (``in_channels``,
``out_channels``, ``z_channels``, ``num_res_blocks``, ``version``) and, for models other than the
released widths, the ones it leaves at ``VideoEncoder`` / ``VideoDecoder``'s defaults
(``encoder_ch`` = its ``ch`` 32, ``encoder_ch_mult`` (4, 8, 16, 16), ``down_sampling_layer``
[1, 2], ``decoder_ch`` 128, ``decoder_ch_mult`` (1, 2, 4, 4), ``temporal_up_layers`` [2, 3],
``temporal_downsample`` 4); the defaults here are the released v2 model (the reference class's
own defaults, ``z_channels`` 16 and ``version`` 1, are ``vae.safetensors``'s). ``frame_len`` is
its 17. ``scaling_factor`` is its pipeline's ``scale_factor`` (1.0: the denoiser's latents are the
VAE's); mmcore's normalisation (``mmcore.kits.normalise_latents``) applies it.

Chunking is the reference's: ``encode`` runs each group of 17 frames through the encoder alone
and concatenates the latents; ``decode`` runs each group of 3 (version 1: 5) latent frames alone
and blends the two frames either side of each group boundary (``mix``: 0.6 / 0.4). Encoding a
clip longer than one group in one pass would differ (the convolutions would see the earlier
group); the reference never does, so neither does this.

``encode(x).latent_dist`` is diffusers' ``DiagonalGaussianDistribution``: the reference's own
splits the same channels in two (mean, log-variance), clamps the log-variance to [-30, 20] and
samples ``mean + exp(logvar / 2) * noise`` just as diffusers' does (the reference's ``encode``
returns such a sample; mmcore caches ``mode()``, the mean). Layout here is mmcore's, channels
first: ``encode`` takes [B, 3, F, H, W], latents are [B, C, F', H', W'] (the reference's
pipeline holds them frames first, [B, F', C, H', W']: the same numbers, transposed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from mmcore.kits import OwnFolderModel

from mm_pack_stepvideo.stepvae_blocks import (
    GROUPS,
    AttnBlock,
    CausalConv3d,
    CausalConvOut,
    ConvToChannels,
    ConvToSpaceTime,
    Downsample2D,
    Downsample3D,
    ResnetBlock,
    Upsample2D,
    Upsample3D,
    averaged_shortcut,
    duplicated_shortcut,
    group_norm,
)


@dataclass
class StepVideoVAEDecoderOutput(BaseOutput):
    sample: torch.Tensor


def middle(channels: int, per_frame: bool) -> nn.Module:
    mid = nn.Module()
    mid.block_1 = ResnetBlock(channels, channels, per_frame)
    mid.attn_1 = AttnBlock(channels, per_frame)
    mid.block_2 = ResnetBlock(channels, channels, per_frame)
    return mid


def run_middle(mid: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return mid.block_2(mid.attn_1(mid.block_1(h)))


class Encoder(nn.Module):
    def __init__(self, ch: int, ch_mult: list[int], num_res_blocks: int, in_channels: int, z_channels: int, down_sampling_layer: list[int], version: int) -> None:
        super().__init__()
        per_frame = version == 2
        self.version, self.z_channels = version, z_channels
        self.conv_in = CausalConv3d(in_channels, ch, 3)
        self.down = nn.ModuleList()
        block_in = ch
        for level, mult in enumerate(ch_mult):
            down = nn.Module()
            down.block = nn.ModuleList()
            for _ in range(num_res_blocks):
                down.block.append(ResnetBlock(block_in, ch * mult, per_frame))
                block_in = ch * mult
            if level != len(ch_mult) - 1:
                down.downsample = Downsample3D(block_in) if level in down_sampling_layer else Downsample2D(block_in)
            self.down.append(down)
        self.mid = middle(block_in, per_frame)
        self.norm_out = nn.GroupNorm(GROUPS, block_in)
        if version == 2:
            self.patch_channels = 4 * z_channels * 2**3
            self.conv_patchify = ConvToChannels(block_in, self.patch_channels, 2)
            self.conv_out = CausalConv3d(self.patch_channels, 2 * z_channels, 3)
        else:
            self.conv_out = CausalConv3d(block_in, 2 * z_channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for down in self.down:
            for block in down.block:
                h = block(h)
            if hasattr(down, "downsample"):
                h = down.downsample(h)
        h = group_norm(run_middle(self.mid, h), self.norm_out, self.version == 2, silu=True)
        if self.version == 1:
            return self.conv_out(h)
        h = self.conv_patchify(h) + averaged_shortcut(h, 2, self.patch_channels)
        return self.conv_out(h) + averaged_shortcut(h, 1, 2 * self.z_channels)


class Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult: list[int], num_res_blocks: int, out_channels: int, z_channels: int, temporal_up_layers: list[int], temporal_downsample: int, version: int) -> None:
        super().__init__()
        per_frame = version == 2
        self.version, self.temporal_downsample = version, temporal_downsample
        block_in = ch * ch_mult[-1]
        self.block_in = block_in
        if version == 2:
            self.patch_channels = 4 * z_channels * 2**3
            self.conv_in = CausalConv3d(z_channels, self.patch_channels, 3)
            self.conv_unpatchify = ConvToSpaceTime(self.patch_channels, block_in, 2)
        else:
            self.conv_in = CausalConv3d(z_channels, block_in, 3)
        self.mid = middle(block_in, per_frame)
        ups: list[nn.Module] = []
        for level in reversed(range(len(ch_mult))):
            up = nn.Module()
            up.block = nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                up.block.append(ResnetBlock(block_in, ch * ch_mult[level], per_frame))
                block_in = ch * ch_mult[level]
            if level != 0:
                up.upsample = Upsample3D(block_in, per_frame) if level in temporal_up_layers else Upsample2D(block_in)
            ups.insert(0, up)
        self.up = nn.ModuleList(ups)  # up[level], run from the last level to the first
        self.norm_out = nn.GroupNorm(GROUPS, block_in)
        self.conv_out = CausalConvOut(block_in, out_channels, 3)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        if self.version == 2:
            h = h + duplicated_shortcut(z, 1, self.patch_channels)
            h = self.conv_unpatchify(h) + duplicated_shortcut(h, 2, self.block_in)
        h = run_middle(self.mid, h)
        for up in reversed(self.up):
            for block in up.block:
                h = block(h)
            if hasattr(up, "upsample"):
                h = up.upsample(h)
        h = self.conv_out(group_norm(h, self.norm_out, self.version == 2, silu=True))
        return h[:, :, self.temporal_downsample - 1 :]


class StepVideoVAE(OwnFolderModel, ModelMixin, ConfigMixin):
    """Step-Video's Video-VAE (see the module's docstring for the fields). ``from_pretrained`` reads a
    folder of the released layout (``vae_v2.safetensors`` or ``vae.safetensors``, with or without
    a ``config.json``) or ``save_pretrained``'s, strictly (:mod:`mm_pack_stepvideo.stepvae_io`)."""

    config_name = "config.json"
    _supports_gradient_checkpointing = False

    @register_to_config
    def __init__(
        self,
        in_channels: int = 3,
        out_channels: int = 3,
        z_channels: int = 64,
        num_res_blocks: int = 2,
        version: int = 2,
        encoder_ch: int = 32,
        encoder_ch_mult: tuple[int, ...] = (4, 8, 16, 16),
        down_sampling_layer: tuple[int, ...] = (1, 2),
        decoder_ch: int = 128,
        decoder_ch_mult: tuple[int, ...] = (1, 2, 4, 4),
        temporal_up_layers: tuple[int, ...] = (2, 3),
        temporal_downsample: int = 4,
        frame_len: int = 17,
        scaling_factor: float = 1.0,
    ) -> None:
        super().__init__()
        check_config(dict(self.config))
        self.encoder = Encoder(encoder_ch, list(encoder_ch_mult), num_res_blocks, in_channels, z_channels, list(down_sampling_layer), version)
        self.decoder = Decoder(decoder_ch, list(decoder_ch_mult), num_res_blocks, out_channels, z_channels, list(temporal_up_layers), temporal_downsample, version)

    @property
    def spatial_compression_ratio(self) -> int:
        return 2 ** (len(self.config.encoder_ch_mult) - 1) * (2 if self.config.version == 2 else 1)

    @property
    def temporal_compression_ratio(self) -> int:
        """Frames after the first per latent frame within a group: 17 frames -> 3 latent frames (version 2)."""
        return (self.config.frame_len - 1) // (self.latent_len - 1)

    @property
    def latent_len(self) -> int:
        """Latent frames of one group of ``frame_len`` frames (the reference's ``latent_len``)."""
        frames = self.config.frame_len
        for _ in self.config.down_sampling_layer:
            frames = (frames - 1) // 2 + 1
        return frames // 2 + 1 if self.config.version == 2 else frames

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames of a clip of ``num_frames`` (whole groups of ``frame_len``)."""
        return num_frames // self.config.frame_len * self.latent_len

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        """[B, 3, 17k, 16h, 16w] in [-1, 1] -> the posterior over [B, z_channels, 3k, h, w] (version 2),
        each group of 17 frames encoded alone."""
        s, n = self.spatial_compression_ratio, self.config.frame_len
        if x.dim() != 5 or x.shape[1] != self.config.in_channels or x.shape[2] == 0 or x.shape[2] % n or x.shape[3] % s or x.shape[4] % s:
            raise ValueError(f"Step-Video VAE encode: a clip [B, {self.config.in_channels}, a multiple of {n} frames, H, W] with H, W multiples of {s}, got {list(x.shape)}")
        moments = torch.cat([self.encoder(group) for group in x.split(n, dim=2)], dim=2)
        posterior = DiagonalGaussianDistribution(moments)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    def decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
        """[B, z_channels, 3k, h, w] -> the clip [B, 3, 17k, 16h, 16w] (version 2): each group of latent frames decoded alone, the boundaries blended."""
        n = self.latent_len
        if z.dim() != 5 or z.shape[1] != self.config.z_channels or z.shape[2] == 0 or z.shape[2] % n:
            raise ValueError(f"Step-Video VAE decode: latents [B, {self.config.z_channels}, a multiple of {n} frames, h, w], got {list(z.shape)}")
        dec = self.mix(torch.cat([self.decoder(group) for group in z.split(n, dim=2)], dim=2))
        return StepVideoVAEDecoderOutput(sample=dec) if return_dict else (dec,)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        """The reference's blend of each group's last frame and the next group's first: the later one
        first becomes 0.6 of itself and 0.4 of the earlier, then the earlier 0.6 of itself and 0.4 of that."""
        n, frames = self.config.frame_len, x.shape[2]
        front, back = slice(n - 1, frames - 1, n), slice(n, frames, n)
        x = x.clone()
        x[:, :, back] = x[:, :, back] * 0.6 + x[:, :, front] * 0.4
        x[:, :, front] = x[:, :, front] * 0.6 + x[:, :, back] * 0.4
        return x

    def forward(self, sample: torch.Tensor, sample_posterior: bool = False, generator: torch.Generator | None = None) -> Any:
        posterior = self.encode(sample).latent_dist
        return self.decode(posterior.sample(generator) if sample_posterior else posterior.mode())

    @classmethod
    def load_folder(cls, folder: Path, dtype: Any = None) -> StepVideoVAE:
        """A local folder, strictly (:func:`mm_pack_stepvideo.stepvae_io.load_stepvae`); ``dtype`` casts it
        (``from_pretrained``, :class:`mmcore.kits.OwnFolderModel`'s, calls this)."""
        from mm_pack_stepvideo.stepvae_io import load_stepvae

        return load_stepvae(folder, dtype)


def check_config(c: dict[str, Any]) -> None:
    """One ValueError line naming the field a config gets wrong (what the reference would fail on, or build another model from)."""
    enc = [c["encoder_ch"]] + [c["encoder_ch"] * m for m in c["encoder_ch_mult"]]
    dec = [c["decoder_ch"] * m for m in c["decoder_ch_mult"]]
    problems = {
        "version": c["version"] not in (1, 2),
        "encoder_ch": enc[0] % GROUPS,
        "encoder_ch_mult": len(c["encoder_ch_mult"]) < 2 or any(w % GROUPS for w in enc),
        "decoder_ch_mult": len(c["decoder_ch_mult"]) != len(c["encoder_ch_mult"]) or any(w % GROUPS for w in dec),
        "down_sampling_layer": any(not 0 <= i < len(c["encoder_ch_mult"]) - 1 for i in c["down_sampling_layer"]),
        "temporal_up_layers": len(c["temporal_up_layers"]) != len(c["down_sampling_layer"]) or any(not 0 < i < len(c["decoder_ch_mult"]) for i in c["temporal_up_layers"]),
        "z_channels": c["z_channels"] <= 0 or (c["version"] == 2 and (enc[-1] * 8 % (32 * c["z_channels"]) or dec[-1] * 8 % (32 * c["z_channels"]))),
        "frame_len": c["frame_len"] <= 0 or (c["frame_len"] - 1) % 2 ** (len(c["down_sampling_layer"]) + (c["version"] == 2)),
        "temporal_downsample": c["temporal_downsample"] != 2 ** len(c["temporal_up_layers"]),
        "num_res_blocks": c["num_res_blocks"] <= 0,
    }
    for field, bad in problems.items():
        if bad:
            raise ValueError(f"Step-Video VAE config: {field} {c[field]!r} does not build the reference's model (widths multiples of {GROUPS}; see mm_pack_stepvideo.stepvae)")
