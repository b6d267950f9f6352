"""Open-Sora Plan v1.5's video VAE, the WF-VAE (Wavelet-Flow VAE; PKU-YuanGroup/WF-VAE
``WFVAEModel``, the same model as MindSpeed-MM's ``WFVAE``), single-device torch code as a
diffusers ``ModelMixin``.

The clip goes through a 3-D Haar transform first (2x in time, rows, columns); the low band of its
RGB is transformed again twice ("energy flow" paths l1, l2) and enters the encoder's second and
third levels through convolutions, so low frequencies reach the latent by short paths; the
decoder mirrors it (its l2 and l1 outputs are added to the low bands before each inverse Haar
transform). The released model (``config.json`` of the hub's ``vae/``): ``latent_dim`` 32,
``base_channels`` 160, every ``l1_*`` / ``l2_*`` block the 3-D one: 8x compression in time,
rows and columns; 8k + 1 frames give k + 1 latent frames (frame 0 alone: the convolutions are
causal in time).

Config fields are the reference's ``WFVAEModel`` arguments; the state dict's keys are those of its
``checkpoint.ckpt`` (``encoder.down1.0.weight``, ``decoder.up2.2.conv.conv.weight``, ...).
``encode(x).latent_dist`` is a diffusers ``DiagonalGaussianDistribution`` (``sample(generator)``,
``mode()``), ``decode(z).sample`` the clip.

**Scaling.** The raw latents are what the reference's VAE returns; its pipelines (MindSpeed-MM
``WFVAE.encode`` / ``decode``) hand the denoiser ``(z - shift) * scale`` per channel (the config's
``shift``, ``scale`` lists) and decode ``z / scale + shift``. mmcore's pipelines normalise by
``latents_mean`` / ``latents_std`` buffers (:func:`mmcore.kits.normalise_latents`: ``(z - mean) /
std``), so this class carries ``latents_mean = shift`` and ``latents_std = 1 / scale`` (not saved):
the same map up to float rounding (one ulp).

Tiling: ``enable_tiling`` encodes and decodes in chunks of frames with the same latents and clips
(each causal layer keeps what its next window needs, the decoder's time upsampling holds back the
frame that needs the next chunk's first: :class:`~mm_pack_opensoraplan.wfvae_blocks.Streaming`,
:meth:`Decoder.align`). Only the
3-D energy-flow blocks are (the released 8x8x8 model's); the 4x8x8 variant (2-D ``l1`` blocks,
WF-VAE-L of Open-Sora Plan v1.3) is a config error.
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

from mm_pack_opensoraplan.wfvae_blocks import (
    AttnBlock3DFix,
    CausalConv3d,
    FrameConv2d,
    HaarWaveletTransform3D,
    InverseHaarWaveletTransform3D,
    ResnetBlock2D,
    ResnetBlock3D,
    Spatial2xTime2x3DDownsample,
    Spatial2xTime2x3DUpsample,
    normalize,
    silu,
)

#: the only block choices ported (the released model's); the reference's fields keep its spelling ("dowmsample")
SUPPORTED = {
    "l1_dowmsample_block": "Spatial2xTime2x3DDownsample",
    "l2_dowmsample_block": "Spatial2xTime2x3DDownsample",
    "l1_downsample_wavelet": "HaarWaveletTransform3D",
    "l2_downsample_wavelet": "HaarWaveletTransform3D",
    "l1_upsample_block": "Spatial2xTime2x3DUpsample",
    "l2_upsample_block": "Spatial2xTime2x3DUpsample",
    "l1_upsample_wavelet": "InverseHaarWaveletTransform3D",
    "l2_upsample_wavelet": "InverseHaarWaveletTransform3D",
    "attention_type": "AttnBlock3DFix",
}


@dataclass
class WFVAEDecoderOutput(BaseOutput):
    sample: torch.Tensor


class Encoder(nn.Module):
    def __init__(self, latent_dim: int, base_channels: int, num_resblocks: int, energy_flow_hidden_size: int, dropout: float, use_attention: bool, norm_type: str) -> None:
        super().__init__()
        b, e = base_channels, energy_flow_hidden_size
        self.down1 = nn.Sequential(FrameConv2d(24, b, 3, padding=1), *(ResnetBlock2D(b, b, norm_type, dropout) for _ in range(num_resblocks)), Spatial2xTime2x3DDownsample(b, b))
        self.down2 = nn.Sequential(
            FrameConv2d(b + e, 2 * b, 3, padding=1),
            *(ResnetBlock3D(2 * b, 2 * b, norm_type, dropout) for _ in range(num_resblocks)),
            Spatial2xTime2x3DDownsample(2 * b, 2 * b),
        )
        self.connect_l1 = FrameConv2d(24, e, 3, padding=1)
        self.connect_l2 = FrameConv2d(24, e, 3, padding=1)
        mid: list[nn.Module] = [ResnetBlock3D(2 * b + e, 4 * b, norm_type, dropout), ResnetBlock3D(4 * b, 4 * b, norm_type, dropout)]
        if use_attention:
            mid.insert(1, AttnBlock3DFix(4 * b, norm_type))
        self.mid = nn.Sequential(*mid)
        self.norm_out = normalize(4 * b, norm_type)
        self.conv_out = CausalConv3d(4 * b, 2 * latent_dim, 3, padding=1)
        self.wavelet_transform_in = HaarWaveletTransform3D()
        self.wavelet_transform_l1 = HaarWaveletTransform3D()
        self.wavelet_transform_l2 = HaarWaveletTransform3D()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        coeffs = self.wavelet_transform_in(x)
        l1_coeffs = self.wavelet_transform_l1(coeffs[:, :3])  # the low band of R, G, B, again
        l2_coeffs = self.wavelet_transform_l2(l1_coeffs[:, :3])
        h = self.down2(torch.cat([self.down1(coeffs), self.connect_l1(l1_coeffs)], dim=1))
        h = self.mid(torch.cat([h, self.connect_l2(l2_coeffs)], dim=1))
        return self.conv_out(silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(
        self,
        latent_dim: int,
        base_channels: int,
        num_resblocks: int,
        energy_flow_hidden_size: int,
        dropout: float,
        use_attention: bool,
        norm_type: str,
        t_interpolation: str,
        connect_res_layer_num: int,
    ) -> None:
        super().__init__()
        b, e = base_channels, energy_flow_hidden_size
        self.energy_flow_hidden_size = e

        def res(cin: int, cout: int) -> ResnetBlock3D:
            return ResnetBlock3D(cin, cout, norm_type, dropout)

        self.conv_in = CausalConv3d(latent_dim, 4 * b, 3, padding=1)
        mid: list[nn.Module] = [res(4 * b, 4 * b), res(4 * b, 4 * b + e)]
        if use_attention:
            mid.insert(1, AttnBlock3DFix(4 * b, norm_type))
        self.mid = nn.Sequential(*mid)
        self.up2 = nn.Sequential(*(res(4 * b, 4 * b) for _ in range(num_resblocks)), Spatial2xTime2x3DUpsample(4 * b, 4 * b, t_interpolation), res(4 * b, 4 * b + e))
        self.up1 = nn.Sequential(*(res(4 * b if i == 0 else 2 * b, 2 * b) for i in range(num_resblocks)), Spatial2xTime2x3DUpsample(2 * b, 2 * b, t_interpolation), res(2 * b, 2 * b))
        self.layer = nn.Sequential(res(2 * b, b), res(b, b))
        self.connect_l1 = nn.Sequential(*(res(e, e) for _ in range(connect_res_layer_num)), FrameConv2d(e, 24, 3, padding=1))
        self.connect_l2 = nn.Sequential(*(res(e, e) for _ in range(connect_res_layer_num)), FrameConv2d(e, 24, 3, padding=1))
        self.norm_out = normalize(b, norm_type)
        self.conv_out = FrameConv2d(b, 24, 3, padding=1)
        self.inverse_wavelet_transform_out = InverseHaarWaveletTransform3D()
        self.inverse_wavelet_transform_l1 = InverseHaarWaveletTransform3D()
        self.inverse_wavelet_transform_l2 = InverseHaarWaveletTransform3D()

    #: streaming (chunks of latent frames): frames of an energy-flow branch not yet matched by the
    #: main path, which the upsamplers' look-ahead holds one frame behind
    pending: dict[str, torch.Tensor] | None = None

    def align(self, name: str, branch: torch.Tensor, frames: int) -> torch.Tensor:
        if self.pending is None:
            return branch
        held = self.pending.get(name)
        branch = branch if held is None else torch.cat([held, branch], dim=2)
        self.pending[name] = branch[:, :, frames:]
        return branch[:, :, :frames]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        e = self.energy_flow_hidden_size
        h = self.mid(self.conv_in(z))
        l2 = self.inverse_wavelet_transform_l2(self.connect_l2(h[:, -e:]))
        h = self.up2(h[:, :-e])
        l1_coeffs = self.connect_l1(h[:, -e:])
        l2 = self.align("l2", l2, l1_coeffs.shape[2])
        l1 = self.inverse_wavelet_transform_l1(torch.cat([l1_coeffs[:, :3] + l2, l1_coeffs[:, 3:]], dim=1))
        h = self.conv_out(silu(self.norm_out(self.layer(self.up1(h[:, :-e])))))
        l1 = self.align("l1", l1, h.shape[2])
        return self.inverse_wavelet_transform_out(torch.cat([h[:, :3] + l1, h[:, 3:]], dim=1))


class WFVAEModel(OwnFolderModel, ModelMixin, ConfigMixin):
    """The WF-VAE; config fields are the reference ``WFVAEModel``'s, with its defaults except the
    ``l1_*`` blocks (the 3-D ones, the only ones ported) and ``scale`` / ``shift`` (absent: ones
    and zeros, no normalisation); the released v1.5 model's values are in its ``config.json``. ``from_pretrained`` reads a folder of the
    released layout (``config.json`` + ``checkpoint.ckpt``) or of ``save_pretrained``'s
    (``config.json`` + ``diffusion_pytorch_model.safetensors``), strictly
    (:mod:`mm_pack_opensoraplan.wfvae_io`)."""

    config_name = "config.json"
    _supports_gradient_checkpointing = False

    @register_to_config
    def __init__(
        self,
        latent_dim: int = 8,
        base_channels: int = 128,
        encoder_num_resblocks: int = 2,
        encoder_energy_flow_hidden_size: int = 64,
        decoder_num_resblocks: int = 2,
        decoder_energy_flow_hidden_size: int = 128,
        attention_type: str = "AttnBlock3DFix",
        use_attention: bool = True,
        dropout: float = 0.0,
        norm_type: str = "groupnorm",
        t_interpolation: str = "nearest",
        connect_res_layer_num: int = 1,
        scale: list[float] | None = None,
        shift: list[float] | None = None,
        l1_dowmsample_block: str = "Spatial2xTime2x3DDownsample",
        l1_downsample_wavelet: str = "HaarWaveletTransform3D",
        l2_dowmsample_block: str = "Spatial2xTime2x3DDownsample",
        l2_downsample_wavelet: str = "HaarWaveletTransform3D",
        l1_upsample_block: str = "Spatial2xTime2x3DUpsample",
        l1_upsample_wavelet: str = "InverseHaarWaveletTransform3D",
        l2_upsample_block: str = "Spatial2xTime2x3DUpsample",
        l2_upsample_wavelet: str = "InverseHaarWaveletTransform3D",
    ) -> None:
        super().__init__()
        given = dict(self.config)
        for field, value in SUPPORTED.items():
            if given[field] != value:
                raise ValueError(f"WF-VAE config: {field} {given[field]!r} is not ported (only {value!r}: the released 8x8x8 model's)")
        scale = [1.0] * latent_dim if scale is None else list(scale)
        shift = [0.0] * latent_dim if shift is None else list(shift)
        if len(scale) != latent_dim or len(shift) != latent_dim:
            raise ValueError(f"WF-VAE config: scale ({len(scale)}) and shift ({len(shift)}) need latent_dim ({latent_dim}) values each")
        common = {"latent_dim": latent_dim, "base_channels": base_channels, "dropout": dropout, "use_attention": use_attention, "norm_type": norm_type}
        self.encoder = Encoder(num_resblocks=encoder_num_resblocks, energy_flow_hidden_size=encoder_energy_flow_hidden_size, **common)
        self.decoder = Decoder(
            num_resblocks=decoder_num_resblocks, energy_flow_hidden_size=decoder_energy_flow_hidden_size, t_interpolation=t_interpolation, connect_res_layer_num=connect_res_layer_num, **common
        )
        # mmcore's normalisation (z - mean) / std is the reference's (z - shift) * scale
        self.register_buffer("latents_mean", torch.tensor(shift, dtype=torch.float32), persistent=False)
        self.register_buffer("latents_std", 1.0 / torch.tensor(scale, dtype=torch.float32), persistent=False)

    spatial_compression_ratio = 8
    temporal_compression_ratio = 8
    #: frames an encoder pass takes, latent frames a decoder pass takes (after frame 0, alone); None: the whole clip at once
    encode_chunk_frames: int | None = None
    decode_chunk_frames: int | None = None

    def enable_tiling(self, chunk_frames: int = 8, latent_chunk_frames: int = 2) -> None:
        """Encode in chunks of ``chunk_frames`` frames (a multiple of 8) and decode in chunks of
        ``latent_chunk_frames`` latent frames, each layer keeping what its next window needs: the
        same latents and clips at a lower memory peak (the reference's ``enable_tiling`` chose 8
        and 2 for the clips its check ran). Layer norm only: a group norm's statistics span the clip."""
        if chunk_frames <= 0 or chunk_frames % 8 or latent_chunk_frames <= 0:
            raise ValueError(
                f"WF-VAE tiling: chunk_frames {chunk_frames} is not a positive multiple of 8 (the encoder's time compression) or latent_chunk_frames {latent_chunk_frames} is not positive"
            )
        if self.config.norm_type == "groupnorm":
            raise ValueError("WF-VAE tiling: norm_type groupnorm normalises over the whole clip, so chunks would change the latents")
        self.encode_chunk_frames, self.decode_chunk_frames = chunk_frames, latent_chunk_frames

    def disable_tiling(self) -> None:
        self.encode_chunk_frames = self.decode_chunk_frames = None

    def _chunked(self, part: nn.Module, x: torch.Tensor, step: int) -> torch.Tensor:
        """``part`` over frame 0, then chunks of ``step`` frames, its layers streaming (:class:`~mm_pack_opensoraplan.wfvae_blocks.Streaming`)."""
        from mm_pack_opensoraplan.wfvae_blocks import Streaming

        stateful = [m for m in part.modules() if isinstance(m, Streaming)]
        starts = [0, *range(1, x.shape[2], step)]
        out = []
        try:
            for m in stateful:
                m.stream(True)
            if isinstance(part, Decoder):
                part.pending = {}
            for i, start in enumerate(starts):
                for m in stateful:
                    m.final = i == len(starts) - 1
                out.append(part(x[:, :, start : start + (step if start else 1)]))
        finally:
            for m in stateful:
                m.stream(False)
            if isinstance(part, Decoder):
                part.pending = None
        return torch.cat(out, dim=2)

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        """[B, 3, 8k + 1, 8h, 8w] in [-1, 1] -> the posterior over [B, latent_dim, k + 1, h, w]."""
        if x.dim() != 5 or x.shape[1] != 3 or (x.shape[2] - 1) % 8 or x.shape[3] % 8 or x.shape[4] % 8:
            raise ValueError(f"WF-VAE encode: a clip [B, 3, 8k + 1 frames, H, W] with H, W multiples of 8, got {list(x.shape)}")
        moments = self._chunked(self.encoder, x, self.encode_chunk_frames) if self.encode_chunk_frames else self.encoder(x)
        posterior = DiagonalGaussianDistribution(moments)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    def decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
        """[B, latent_dim, k + 1, h, w] -> the clip [B, 3, 8k + 1, 8h, 8w]."""
        dec = self._chunked(self.decoder, z, self.decode_chunk_frames) if self.decode_chunk_frames else self.decoder(z)
        return WFVAEDecoderOutput(sample=dec) if return_dict else (dec,)

    def forward(self, sample: torch.Tensor, sample_posterior: bool = False, generator: torch.Generator | None = None) -> Any:
        posterior = self.encode(sample).latent_dist
        return self.decode(posterior.sample(generator) if sample_posterior else posterior.mode())

    @classmethod
    def load_folder(cls, folder: Path, dtype: Any = None) -> WFVAEModel:
        """A local folder, strictly (:func:`mm_pack_opensoraplan.wfvae_io.load_wfvae`); ``dtype`` casts it
        (``from_pretrained``, :class:`mmcore.kits.OwnFolderModel`'s, calls this)."""
        from mm_pack_opensoraplan.wfvae_io import load_wfvae

        return load_wfvae(folder, dtype)
