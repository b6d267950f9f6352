"""By-hand equivalence check of mm_pack_bagel against ByteDance-Seed/Bagel's own modeling code.

    OMP_NUM_THREADS=1 .venv/bin/python packs/vlm/bagel/tools/reference_check.py [--repo DIR] [--preset tiny]

``--repo``: a checkout (or ``git archive``) of github.com/ByteDance-Seed/Bagel holding
``modeling/`` and ``data/``; by default the snapshot under ``/work/.mirror`` is extracted to a
temporary folder. The check builds a tiny random release folder (``init:tiny``: the release's
config fields, ``ema.safetensors`` names), builds the reference ``Bagel`` from the same configs
the way its ``app.py`` does (qk_norm, MoT layers, ``rope=False``, one ViT layer dropped, the patch
convolution turned linear) and loads the same ``ema.safetensors`` into it strictly. One packed
row then holds an understanding sample (two ViT images of other shapes, question, answer with CE loss) and a
generation sample (caption, latent with flow-matching loss); both models see the same batch,
the same noise and timesteps, in float32, in training mode. Printed: max |diff| of the
per-token CE, the per-element MSE and the predicted velocities (``llm2vae``'s output, hooked on
the reference), and of the two summed losses; then FLUX's autoencoder: the reference
``AutoEncoder`` holding ``ae.safetensors`` against diffusers' ``AutoencoderKL`` after
diffusers' single-file conversion, on the posterior mean and the decoder output.

Stubs, none of which changes the math: ``flash_attn.flash_attn_varlen_func`` (not installed;
CUDA only) becomes per-sequence SDPA; the reference ViT's cast of q/k/v to bfloat16 (which
flash-attn needs) is kept at float32 by giving ``siglip_navit`` a ``torch`` whose ``bfloat16``
is ``float32``; flex-attention's ``create_block_mask`` (compiled, CUDA-oriented) becomes the
dense mask its ``mask_mod`` defines, evaluated on the full query/key grid, and
``flex_attention`` SDPA under that mask; the reference modules' imports that transformers 5
no longer has (``is_flash_attn_greater_or_equal_2_10`` etc.) get inert stand-ins, and
transformers 4's default RoPE initialiser, which 5 dropped, is put back.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F

MIRROR = Path("/work/.mirror/ByteDance-Seed+Bagel/repo")


def extract(repo: Path | None, into: Path) -> Path:
    if repo is not None:
        return repo
    archive = subprocess.run(["git", "-C", str(MIRROR), "archive", "HEAD", "modeling", "data"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def varlen_sdpa(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, causal=False, **_):  # type: ignore[no-untyped-def]
    """flash_attn_varlen_func's contract over [tokens, heads, dim] with SDPA, one sequence at a time."""
    out = []
    for i in range(len(cu_seqlens_q) - 1):
        sq = slice(int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]))
        sk = slice(int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1]))
        qi, ki, vi = (t.transpose(0, 1)[None] for t in (q[sq], k[sk], v[sk]))
        mask = None
        if causal:  # flash-attn aligns the causal diagonal to the bottom right
            lq, lk = qi.shape[2], ki.shape[2]
            mask = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        out.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1))
    return torch.cat(out)


class DenseMask:
    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask


def dense_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", **_):  # type: ignore[no-untyped-def]
    q = torch.arange(Q_LEN, device=device)[:, None]
    kv = torch.arange(KV_LEN, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    return DenseMask(mask_mod(zero, zero, q, kv).expand(Q_LEN, KV_LEN))


def flex_as_sdpa(q, k, v, block_mask=None, enable_gqa=False, **_):  # type: ignore[no-untyped-def]
    mask = block_mask.mask[: q.shape[2], : k.shape[2]]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)


def default_rope(config, device=None, **_):  # type: ignore[no-untyped-def]
    """transformers 4's ``ROPE_INIT_FUNCTIONS["default"]`` (5 dropped the entry): plain RoPE
    frequencies ``theta^(-2i/d)`` and no attention scaling."""
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim))
    return inv_freq, 1.0


def rearrange(x, pattern, **sizes):  # type: ignore[no-untyped-def]
    """The two einops patterns FLUX's ``AttnBlock`` uses (einops is not installed here)."""
    if pattern == "b c h w -> b 1 (h w) c":
        return x.flatten(2).transpose(1, 2)[:, None]
    if pattern == "b 1 (h w) c -> b c h w":
        return x[:, 0].transpose(1, 2).reshape(sizes["b"], sizes["c"], sizes["h"], sizes["w"])
    raise NotImplementedError(pattern)


def install_stubs(root: Path) -> None:
    try:
        import einops  # noqa: F401
    except ImportError:
        sys.modules["einops"] = types.SimpleNamespace(rearrange=rearrange)  # type: ignore[assignment]
    import transformers.modeling_rope_utils as rope_utils

    rope_utils.ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)
    flash = types.ModuleType("flash_attn")
    flash.flash_attn_varlen_func = varlen_sdpa
    flash.flash_attn_func = None
    sys.modules["flash_attn"] = flash
    import transformers.utils as tu

    for name in ("is_flash_attn_greater_or_equal_2_10", "is_flash_attn_2_available"):
        if not hasattr(tu, name):
            setattr(tu, name, lambda *a, **k: False)
    for name in ("add_start_docstrings", "add_start_docstrings_to_model_forward", "replace_return_docstrings"):
        if not hasattr(tu, name):
            setattr(tu, name, lambda *a, **k: lambda f: f)
    # packages whose __init__ pulls in what a training check does not need (tokenizers, gradio
    # helpers): their modules are imported directly from the folders
    sys.path.insert(0, str(root))
    for package in ("modeling", "modeling.bagel", "modeling.qwen2", "modeling.siglip", "modeling.cache_utils", "data"):
        module = types.ModuleType(package)
        module.__path__ = [str(root / package.replace(".", "/"))]
        sys.modules[package] = module


def reference_model(folder: Path):  # type: ignore[no-untyped-def]
    import modeling.bagel.bagel as rb
    import modeling.bagel.qwen2_navit as rq
    import modeling.bagel.siglip_navit as rs

    from mm_pack_bagel.config import DEFAULTS, read_json

    rb.create_block_mask = dense_block_mask
    rq.flex_attention = flex_as_sdpa
    rs.torch = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    rs.torch.bfloat16 = torch.float32

    llm = rq.Qwen2Config(**read_json(folder / "llm_config.json"))
    llm.qk_norm, llm.tie_word_embeddings, llm.layer_module = True, False, "Qwen2MoTDecoderLayer"
    llm._attn_implementation = "eager"
    if "pad_token_id" not in llm.__dict__:  # transformers 5 configs no longer default it; Qwen2Model reads it
        llm.pad_token_id = None
    vit = rs.SiglipVisionConfig(**read_json(folder / "vit_config.json"))
    vit.rope = False
    vit.num_hidden_layers -= 1
    extra = {**DEFAULTS, **read_json(folder / "config.json")}
    from mm_pack_bagel.vae import shape_from_weights

    shape = shape_from_weights(folder / "ae.safetensors")
    vae_config = types.SimpleNamespace(downsample=shape["downsample"], z_channels=shape["z_channels"])
    config = rb.BagelConfig(llm_config=llm, vit_config=vit, vae_config=vae_config, **extra)
    model = rb.Bagel(rq.Qwen2ForCausalLM(llm), rs.SiglipVisionModel(vit), config)
    model.vit_model.vision_model.embeddings.convert_conv2d_to_linear(vit)
    from safetensors.torch import load_file

    state = {k: v.float() for k, v in load_file(str(folder / "ema.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("inv_freq",))]
    if missing or unexpected:
        raise SystemExit(f"the reference Bagel does not take ema.safetensors: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.float()


def reference_vae(root: Path, folder: Path):  # type: ignore[no-untyped-def]
    import importlib

    from safetensors.torch import load_file

    from mm_pack_bagel.vae import SCALE, SHIFT, shape_from_weights

    ae = importlib.import_module("modeling.autoencoder")
    shape = shape_from_weights(folder / "ae.safetensors")
    base = shape["block_out_channels"][0]
    params = ae.AutoEncoderParams(
        resolution=64,
        in_channels=3,
        downsample=shape["downsample"],
        ch=base,
        out_ch=3,
        ch_mult=[c // base for c in shape["block_out_channels"]],
        num_res_blocks=shape["layers_per_block"],
        z_channels=shape["z_channels"],
        scale_factor=SCALE,
        shift_factor=SHIFT,
    )
    model = ae.AutoEncoder(params)
    model.load_state_dict(load_file(str(folder / "ae.safetensors")), strict=True)
    return model.eval()


def batch_of(model, tokenizer):  # type: ignore[no-untyped-def]
    from mm_pack_bagel.packing import pack
    from mm_pack_bagel.tiny import token_ids

    c = model.config
    g = torch.Generator().manual_seed(1)
    image = torch.rand(3, 2 * c.vit.patch_size, 3 * c.vit.patch_size, generator=g) * 2 - 1
    latent = torch.randn(c.latent_channels, 3 * c.latent_patch_size, 2 * c.latent_patch_size, generator=g)
    second = torch.rand(3, 3 * c.vit.patch_size, 2 * c.vit.patch_size, generator=g) * 2 - 1
    understanding = [
        {"type": "vit", "image": image},
        {"type": "vit", "image": second},
        {"type": "text", "ids": tokenizer.encode("What colour is the shape?"), "loss": False},
        {"type": "text", "ids": tokenizer.encode("The shape is red."), "loss": True},
    ]
    generation = [{"type": "text", "ids": tokenizer.encode("a red square"), "loss": False}, {"type": "vae", "latent": latent, "loss": True, "timestep": 0.4}]
    return pack(
        [understanding, generation],
        token_ids(tokenizer),
        vit_patch=c.vit.patch_size,
        vit_max_per_side=c.vit_max_num_patch_per_side,
        latent_patch=c.latent_patch_size,
        max_latent_size=c.max_latent_size,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=None)
    parser.add_argument("--preset", default="tiny")
    args = parser.parse_args()
    from mm_pack_bagel.checkpoint import load_model
    from mm_pack_bagel.model import loss
    from mm_pack_bagel.tiny import build_init_checkpoint, build_tokenizer
    from mm_pack_bagel.vae import load_vae

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bagel"
        build_init_checkpoint(args.preset, folder, seed=0)  # imports diffusers before the flash_attn stub exists
        root = extract(args.repo, Path(tmp))
        install_stubs(root)
        ours = load_model(folder).train()
        theirs = reference_model(folder).train()
        batch = batch_of(ours, build_tokenizer())
        torch.manual_seed(7)
        clean = ours.patchify_latents(batch["padded_latent"], batch["patchified_vae_latent_shapes"])
        noise = torch.randn_like(clean)
        captured = {}
        theirs.llm2vae.register_forward_hook(lambda m, i, o: captured.__setitem__("velocity", o))
        mine = ours(batch, noise=noise)
        torch.manual_seed(7)  # the reference draws its noise with randn_like at the same point
        ref_args = {k: v for k, v in batch.items() if k != "split_lens" and k != "attn_modes"}
        ref = theirs(**ref_args, split_lens=batch["split_lens"], attn_modes=batch["attn_modes"])
        ref_loss = ref["ce"].sum() / ref["ce"].numel() + ref["mse"].mean(-1).sum() / ref["mse"].shape[0]
        rows = [
            ("CE per token", mine["ce"], ref["ce"]),
            ("MSE per element", mine["mse"], ref["mse"]),
            ("velocity (llm2vae)", mine["velocity"], captured["velocity"]),
            ("loss (CE + MSE)", loss(mine), ref_loss),
        ]
        print(f"reference {root}; preset {args.preset}; float32; {batch['sequence_length']} tokens, splits {batch['attn_modes']}")
        for name, a, b in rows:
            print(f"{name:22s} shape {tuple(a.shape)!s:12s} max|diff| {(a.detach() - b.detach()).abs().max().item():.3e}  max|ref| {b.detach().abs().max().item():.3e}")
        # control: the comparison sees both experts and the tower (a small change in each shows)
        with torch.no_grad():
            ours.vit_model.vision_model.encoder.layers[-1].mlp.fc2.bias.add_(1e-3)
            ours.language_model.model.layers[-1].mlp_moe_gen.down_proj.weight.add_(1e-3)
        nudged = ours(batch, noise=noise)
        print(
            f"control, ViT fc2 bias and gen-expert down_proj +1e-3: CE max|diff| {(nudged['ce'] - ref['ce']).abs().max().item():.3e}, velocity max|diff| {(nudged['velocity'] - captured['velocity']).abs().max().item():.3e}"
        )
        ref_ae, vae = reference_vae(root, folder), load_vae(folder / "ae.safetensors")
        pixels = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 2 - 1
        with torch.no_grad():
            ref_mean = ref_ae.encoder(pixels).chunk(2, dim=1)[0]
            our_mean = vae.encode(pixels).latent_dist.mean
            z = torch.randn(1, vae.config.latent_channels, 8, 8, generator=torch.Generator().manual_seed(4))
            ref_img, our_img = ref_ae.decode(z), vae.decode(z / vae.config.scaling_factor + vae.config.shift_factor).sample
        print(f"{'VAE posterior mean':22s} shape {tuple(our_mean.shape)!s:12s} max|diff| {(our_mean - ref_mean).abs().max().item():.3e}")
        print(f"{'VAE decode':22s} shape {tuple(our_img.shape)!s:12s} max|diff| {(our_img - ref_img).abs().max().item():.3e}")


if __name__ == "__main__":
    main()
