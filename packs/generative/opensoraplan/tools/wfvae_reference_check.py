"""Equivalence of mm_pack_opensoraplan's WF-VAE with the reference ``WFVAEModel`` (PKU-YuanGroup/WF-VAE,
``causalvideovae/model/vae/modeling_wfvae.py``), on CPU, by hand (not a test: it needs the
reference source)::

    git clone https://github.com/PKU-YuanGroup/WF-VAE   # or any checkout of it
    pip install einops
    python packs/generative/opensoraplan/tools/wfvae_reference_check.py /path/to/WF-VAE

Both are built from one small config with the released ``config.json``'s fields (the 8x8x8 block
choices, ``trilinear`` time interpolation, one connection block; narrower channels), once with
``layernorm`` (the released model's) and once with ``groupnorm``. The reference's random weights,
perturbed so that no norm is the identity, are written as the reference's trainer saves them
(``checkpoint.ckpt``, ``state_dict`` -> ``gen_model``) and load strictly into the pack's model; the
encoders' mean and log-variance and the decoders' clips are compared in float32, for a 17-frame
clip and a single frame (an image), the decoders on the reference's latent. Then, with layernorm,
the reference's tiled encode and decode (``enable_tiling``: frame chunks with cached causal context,
what MindSpeed-MM's v1.5 config runs) against this pack's whole-clip ones, for 33 and 65 frames:
tiling is memory only, the same map; and this pack's own tiled encode and decode (``enable_tiling(8, 2)``)
against the reference's.
"""

import sys
import tempfile
from pathlib import Path

ROOT = sys.argv[1] if len(sys.argv) > 1 else "WF-VAE"
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from causalvideovae.model.vae.modeling_wfvae import WFVAEModel as Reference  # noqa: E402

from mm_pack_opensoraplan.wfvae_io import load_wfvae, save_released  # noqa: E402

RELEASED_FIELDS = {
    "connect_res_layer_num": 1,
    "dropout": 0.0,
    "l1_dowmsample_block": "Spatial2xTime2x3DDownsample",
    "l1_downsample_wavelet": "HaarWaveletTransform3D",
    "l1_upsample_block": "Spatial2xTime2x3DUpsample",
    "l1_upsample_wavelet": "InverseHaarWaveletTransform3D",
    "l2_dowmsample_block": "Spatial2xTime2x3DDownsample",
    "l2_downsample_wavelet": "HaarWaveletTransform3D",
    "l2_upsample_block": "Spatial2xTime2x3DUpsample",
    "l2_upsample_wavelet": "InverseHaarWaveletTransform3D",
    "t_interpolation": "trilinear",
    "use_attention": True,
    "attention_type": "AttnBlock3DFix",
}


def check(norm_type: str) -> None:
    torch.manual_seed(0)
    config = {
        **RELEASED_FIELDS,
        "latent_dim": 8,
        "base_channels": 32,
        "encoder_num_resblocks": 2,
        "decoder_num_resblocks": 2,
        "encoder_energy_flow_hidden_size": 32,
        "decoder_energy_flow_hidden_size": 32,
        "norm_type": norm_type,
        "scale": [0.5 + 0.1 * i for i in range(8)],
        "shift": [0.1 * i - 0.3 for i in range(8)],
    }
    ref = Reference(**config).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.requires_grad and ("norm" in name):
                p.add_(0.1 * torch.randn_like(p))
    with tempfile.TemporaryDirectory() as tmp:
        save_released(ref, Path(tmp))  # the reference's save_config + its trainer's checkpoint layout
        ours = load_wfvae(Path(tmp))
    assert set(ours.state_dict()) == set(ref.state_dict()), "key sets differ"
    for frames in (17, 1):
        x = torch.rand(2, 3, frames, 32, 48, generator=torch.Generator().manual_seed(frames)) * 2 - 1
        with torch.no_grad():
            ref_post, our_post = ref.encode(x).latent_dist, ours.encode(x).latent_dist
            ref_dec, our_dec = ref.decode(ref_post.mode()).sample, ours.decode(ref_post.mode()).sample
        mean_diff = (ref_post.mean - our_post.mean).abs().max().item()
        logvar_diff = (ref_post.logvar - our_post.logvar).abs().max().item()
        dec_diff = (ref_dec - our_dec).abs().max().item()
        print(
            f"{norm_type} {frames:2d} frames: latents {list(our_post.mean.shape)} clip {list(our_dec.shape)};"
            f" max |diff| mean {mean_diff:.3g} logvar {logvar_diff:.3g} decode {dec_diff:.3g}"
            f" (std of mean {our_post.mean.std().item():.3g}, of clip {our_dec.std().item():.3g})"
        )
        assert our_dec.shape == ref_dec.shape and our_post.mean.shape == ref_post.mean.shape


def check_tiled() -> None:
    torch.manual_seed(1)
    config = {
        **RELEASED_FIELDS,
        "latent_dim": 8,
        "base_channels": 32,
        "encoder_energy_flow_hidden_size": 32,
        "decoder_energy_flow_hidden_size": 32,
        "norm_type": "layernorm",
        "scale": [1.0] * 8,
        "shift": [0.0] * 8,
    }
    ref = Reference(**config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        save_released(ref, Path(tmp))
        ours = load_wfvae(Path(tmp))
    for frames in (33, 65):
        x = torch.rand(1, 3, frames, 32, 32, generator=torch.Generator().manual_seed(frames)) * 2 - 1
        ref.temporal_size = None  # the reference picks its chunks for the clip's length on first use
        ref.enable_tiling(True)
        with torch.no_grad():
            tiled = ref.encode(x).latent_dist
            tiled_dec = ref.decode(tiled.mode()).sample
            whole, whole_dec = ours.encode(x).latent_dist, ours.decode(tiled.mode()).sample
            ours.enable_tiling(8, 2)
            ours_tiled, ours_tiled_dec = ours.encode(x).latent_dist, ours.decode(tiled.mode()).sample
            ours.disable_tiling()
        ref.enable_tiling(False)
        print(
            f"layernorm {frames} frames, the reference tiled (chunks {ref.t_chunk_enc} frames encoding, {ref.t_chunk_dec} latent frames decoding) vs this pack whole:"
            f" max |diff| mean {(tiled.mean - whole.mean).abs().max().item():.3g} logvar {(tiled.logvar - whole.logvar).abs().max().item():.3g}"
            f" decode {(tiled_dec - whole_dec).abs().max().item():.3g}; this pack's tiled encode (8 frames):"
            f" mean {(tiled.mean - ours_tiled.mean).abs().max().item():.3g} logvar {(tiled.logvar - ours_tiled.logvar).abs().max().item():.3g},"
            f" its tiled decode (2 latent frames) {(tiled_dec - ours_tiled_dec).abs().max().item():.3g}"
        )


if __name__ == "__main__":
    for norm in ("layernorm", "groupnorm"):
        check(norm)
    check_tiled()
