"""Equivalence of mm_pack_stepvideo's Video-VAE with the reference ``AutoencoderKL``
(stepfun-ai/Step-Video-T2V ``stepvideo/vae/vae.py``), on CPU in float32, by hand (not a test: it
needs the reference source)::

    git clone https://github.com/stepfun-ai/Step-Video-T2V   # or any checkout of it
    pip install einops
    python packs/generative/stepvideo/tools/stepvae_reference_check.py /path/to/Step-Video-T2V [--released]

Stubbed, infrastructure only: ``stepvideo.utils`` (whose package imports the whole repository's
dependencies) is replaced by a module whose ``with_empty_init`` leaves ``__init__`` as it is (the
reference's skips the random initialisation, which the loaded weights replace anyway). The
reference's ``AutoencoderKL`` builds its encoder and decoder at the released widths; for the small
configs its ``VideoEncoder`` / ``VideoDecoder`` are given narrower ``ch`` / ``ch_mult`` (their
own constructor arguments), nothing else. ``--released`` also runs the released sizes (version 2,
64 channels, 499M parameters each; peak RSS 8.8 GB), on a smaller clip.

For each config: this pack's model gets random weights (norms perturbed so that none is the
identity) and is written in the released layout (``vae_v2.safetensors`` / ``vae.safetensors``);
the reference loads that file with its own ``init_from_ckpt`` (which renames
``decoder.conv_out.*``) and ``load_state_dict`` (strict). Compared: the encoder's mean and
log-variance (the reference's ``naive_encode`` per group of 17 frames and its
``DiagonalGaussianDistribution``; its ``encode`` returns a random sample of it), and ``decode``
(its chunks and ``mix``), on the reference's latents, for clips of one and two groups, batch 2.
A control nudges one of this pack's weights and must differ. The narrow version-2 check runs in
float64 too (a difference that is rounding shrinks there by orders of magnitude) and in bfloat16
(the dtype the reference's server runs it in), where both sides are also compared with this
pack's float32 outputs: the size of bfloat16's own rounding.
"""

from __future__ import annotations

import copy
import functools
import sys
import tempfile
import types
from pathlib import Path

import torch

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "Step-Video-T2V")
RELEASED_TOO = "--released" in sys.argv


def reference_module() -> types.ModuleType:
    """``stepvideo/vae/vae.py`` from the checkout, alone (the package's ``__init__`` imports the DiT,
    xDiT and the text encoders), its ``stepvideo.utils`` import stubbed."""
    import importlib.util

    utils = types.ModuleType("stepvideo.utils")
    utils.with_empty_init = lambda func: func  # type: ignore[attr-defined]
    sys.modules["stepvideo.utils"] = utils
    spec = importlib.util.spec_from_file_location("stepvideo_reference_vae", ROOT / "stepvideo" / "vae" / "vae.py")
    ref = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(ref)  # type: ignore[union-attr]
    return ref


def perturbed(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))


def reference_model(ref: types.ModuleType, config: dict, path: Path) -> torch.nn.Module:
    enc = {"ch": config["encoder_ch"], "ch_mult": tuple(config["encoder_ch_mult"])}
    dec = {"ch": config["decoder_ch"], "ch_mult": tuple(config["decoder_ch_mult"])}
    original = ref.VideoEncoder, ref.VideoDecoder
    ref.VideoEncoder, ref.VideoDecoder = functools.partial(original[0], **enc), functools.partial(original[1], **dec)
    try:
        model = ref.AutoencoderKL(z_channels=config["z_channels"], num_res_blocks=config["num_res_blocks"], model_path=str(path), version=config["version"])
    finally:
        ref.VideoEncoder, ref.VideoDecoder = original
    return model.eval()


def check(ref: types.ModuleType, name: str, config: dict, frames: list[int], side: int, dtype: torch.dtype = torch.float32) -> None:
    from mm_pack_stepvideo.stepvae import StepVideoVAE
    from mm_pack_stepvideo.stepvae_io import RELEASED, load_stepvae, save_released

    torch.manual_seed(0)
    ours = StepVideoVAE(**config).eval()
    perturbed(ours, 1)
    with tempfile.TemporaryDirectory() as tmp:
        save_released(ours, Path(tmp))
        reference = reference_model(ref, config, Path(tmp) / RELEASED[config["version"]]).to(dtype)  # sets the reference's per-frame norm flag for its version
        assert torch.equal(load_stepvae(Path(tmp)).state_dict()["decoder.conv_out.weight"], ours.state_dict()["decoder.conv_out.weight"])
    exact = copy.deepcopy(ours)  # float32: how far this dtype's rounding alone moves the outputs
    ours = ours if dtype == torch.float32 else ours.to(dtype)
    params = sum(p.numel() for p in ours.parameters())
    print(f"{name}, {dtype}: {params / 1e6:.2f}M parameters, the reference's {sum(p.numel() for p in reference.parameters()) / 1e6:.2f}M, loaded strictly from this pack's file")
    for count in frames:
        x = (torch.rand(2, 3, count, side, side, generator=torch.Generator().manual_seed(count)) * 2 - 1).to(dtype)
        with torch.no_grad():
            post = ours.encode(x).latent_dist
            moments = torch.cat([reference.naive_encode(chunk) for chunk in x.transpose(1, 2).split(reference.frame_len, dim=1)], dim=1)
            theirs = ref.DiagonalGaussianDistribution(moments)
            mean, logvar = theirs.mean.transpose(1, 2), theirs.logvar.transpose(1, 2)
            decoded = ours.decode(mean).sample
            their_decoded = reference.decode(theirs.mean.clone()).transpose(1, 2)
        d_mean, d_logvar, d_dec = ((a - b).abs().max().item() for a, b in ((post.mean, mean), (post.logvar, logvar), (decoded, their_decoded)))
        if dtype != torch.float32:
            with torch.no_grad():
                ref32 = exact.encode(x.float()).latent_dist.mean
                dec32 = exact.decode(ref32).sample
            print(f"  {count} frames: the reference in {dtype} against this pack in float32: mean {(mean.float() - ref32).abs().max():.2e}, decode {(their_decoded.float() - dec32).abs().max():.2e}")
        print(
            f"  {count} frames {side}x{side} -> latents {list(mean.shape)}: max |diff| mean {d_mean:.2e}, logvar {d_logvar:.2e}, decode {d_dec:.2e}"
            f" (std {mean.std():.3f}, {logvar.std():.3f}, {their_decoded.std():.3f}); clip {list(their_decoded.shape)}"
        )
    with torch.no_grad():
        next(p for n, p in ours.named_parameters() if n.endswith("conv_in.conv.weight")).add_(1e-3)
        control = (ours.encode(x).latent_dist.mean - mean).abs().max().item()
    print(f"  control (encoder.conv_in nudged by 1e-3): mean differs by {control:.2e}")
    assert control > 1e-5


def main() -> None:
    ref = reference_module()
    small = {"encoder_ch": 32, "encoder_ch_mult": (1, 2, 2, 2), "decoder_ch": 32, "decoder_ch_mult": (1, 1, 2, 2), "num_res_blocks": 2}
    check(ref, "version 2 (vae_v2's fields), narrow", {**small, "version": 2, "z_channels": 8}, [17, 34], 64)
    check(ref, "version 2 (vae_v2's fields), narrow", {**small, "version": 2, "z_channels": 8}, [34], 64, torch.float64)  # rounding or not
    check(ref, "version 2 (vae_v2's fields), narrow", {**small, "version": 2, "z_channels": 8}, [34], 64, torch.bfloat16)  # the reference's server decodes in bfloat16
    check(ref, "version 1 (vae's fields), narrow", {**small, "version": 1, "z_channels": 16}, [17, 34], 32)
    if RELEASED_TOO:
        check(
            ref,
            "version 2, the released sizes",
            {"encoder_ch": 32, "encoder_ch_mult": (4, 8, 16, 16), "decoder_ch": 128, "decoder_ch_mult": (1, 2, 4, 4), "num_res_blocks": 2, "version": 2, "z_channels": 64},
            [17],
            32,
        )


if __name__ == "__main__":
    main()
