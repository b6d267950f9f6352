"""FLUX's autoencoder (``ae.safetensors``, Black Forest Labs' key names) as diffusers'
``AutoencoderKL``.

BFL's file is the LDM layout without a prefix (``encoder.down.0.block.1.norm1.weight``,
``decoder.mid.attn_1.q.weight`` as 1x1 convolutions); diffusers' own single-file conversion
(``convert_ldm_vae_checkpoint``) maps it to ``AutoencoderKL``'s names. Writing the file back
(``init:tiny``, export) needs the reverse, which diffusers does not ship: :func:`to_bfl` below,
checked in the tests by converting its output forward again, bit for bit.

FLUX's file has no config: the channels, levels, blocks per level and latent channels are read
off the tensor shapes; the latent scale and shift are FLUX's constants (as BAGEL's ``load_ae``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from mmcore.errors import StageError

SCALE, SHIFT = 0.3611, 0.1159


def shape_from_weights(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    if not Path(path).is_file():
        raise StageError(f"{path}: missing (BAGEL's generation direction needs FLUX's autoencoder)")
    with safe_open(path, "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    need = ("encoder.conv_in.weight", "encoder.conv_out.weight")
    for key in need:
        if key not in shapes:
            raise StageError(f"{path}: no tensor {key} (not a FLUX/LDM autoencoder in BFL's key names)")
    levels = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.down\.(\d+)\.", k)))
    blocks = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.down\.0\.block\.(\d+)\.", k)))
    channels = [shapes[f"encoder.down.{i}.block.{blocks - 1}.conv2.weight"][0] for i in range(levels)]
    return {
        "block_out_channels": channels,
        "layers_per_block": blocks,
        "z_channels": shapes["encoder.conv_out.weight"][0] // 2,
        "downsample": 2 ** (levels - 1),
        "in_channels": shapes["encoder.conv_in.weight"][1],
    }


def diffusers_config(shape: dict[str, Any]) -> dict[str, Any]:
    """``AutoencoderKL``'s config of FLUX's autoencoder with ``shape``'s sizes."""
    levels = len(shape["block_out_channels"])
    return {
        "in_channels": shape["in_channels"],
        "out_channels": shape["in_channels"],
        "down_block_types": ["DownEncoderBlock2D"] * levels,
        "up_block_types": ["UpDecoderBlock2D"] * levels,
        "block_out_channels": list(shape["block_out_channels"]),
        "layers_per_block": shape["layers_per_block"],
        "latent_channels": shape["z_channels"],
        "norm_num_groups": 32,
        "act_fn": "silu",
        "scaling_factor": SCALE,
        "shift_factor": SHIFT,
        "use_quant_conv": False,
        "use_post_quant_conv": False,
        "mid_block_add_attention": True,
        "force_upcast": True,
    }


def load_vae(path: Path):  # type: ignore[no-untyped-def]
    """``AutoencoderKL`` holding ``ae.safetensors``'s weights (strictly: every tensor used)."""
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    from safetensors.torch import load_file

    config = diffusers_config(shape_from_weights(path))
    bfl = load_file(str(path))
    converted = convert_ldm_vae_checkpoint(bfl, config)
    vae = AutoencoderKL(**config)
    missing, unexpected = vae.load_state_dict(converted, strict=False)
    if missing or unexpected or len(converted) != len(bfl):
        unused = sorted(set(bfl) - set(to_bfl(converted, len(config["up_block_types"]))))
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}" if unexpected else f"unused {unused[0] if unused else '?'}"
        raise StageError(f"{path}: does not match FLUX's autoencoder layout ({what})")
    return vae.eval()


def to_bfl(state: dict[str, torch.Tensor], levels: int) -> dict[str, torch.Tensor]:
    """``AutoencoderKL``'s state dict in BFL's names and shapes (attention projections as 1x1 convolutions)."""
    out = {}
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    for key, tensor in state.items():
        part, rest = key.split(".", 1)
        name = rest.replace("conv_norm_out", "norm_out").replace("conv_shortcut", "nin_shortcut")
        if m := re.match(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", name):
            name = f"down.{m[1]}.block.{m[2]}.{m[3]}"
        elif m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.(.*)", name):
            name = f"down.{m[1]}.downsample.{m[2]}"
        elif m := re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", name):
            name = f"up.{levels - 1 - int(m[1])}.block.{m[2]}.{m[3]}"
        elif m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.(.*)", name):
            name = f"up.{levels - 1 - int(m[1])}.upsample.{m[2]}"
        elif m := re.match(r"mid_block\.resnets\.(\d+)\.(.*)", name):
            name = f"mid.block_{int(m[1]) + 1}.{m[2]}"
        elif m := re.match(r"mid_block\.attentions\.0\.(group_norm|to_q|to_k|to_v|to_out\.0)\.(.*)", name):
            name = f"mid.attn_1.{attn[m[1]]}.{m[2]}"
            if m[1] != "group_norm" and tensor.ndim == 2:
                tensor = tensor[:, :, None, None]
        out[f"{part}.{name}"] = tensor
    return out


def save_vae(vae, path: Path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in vae.state_dict().items()}
    save_file(to_bfl(state, len(vae.config.up_block_types)), str(path))


def encode(vae, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Pixels in [-1, 1] -> scaled latents, sampled from the posterior as BAGEL's ``AutoEncoder.encode`` does."""
    z = vae.encode(pixels).latent_dist.sample(generator)
    return (z - SHIFT) * SCALE


def decode(vae, latents: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return vae.decode(latents / SCALE + SHIFT).sample
