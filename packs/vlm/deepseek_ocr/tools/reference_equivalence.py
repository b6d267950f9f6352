"""The pack's DeepSeek-OCR against the reference's own DeepEncoder code, on the same tiny random weights.

    python packs/vlm/deepseek_ocr/tools/reference_equivalence.py --reference DeepSeek-OCR-master/DeepSeek-OCR-vllm

``--reference`` is the ``DeepSeek-OCR-vllm`` folder of github.com/deepseek-ai/DeepSeek-OCR (its
``deepencoder/`` package: ``sam_vary_sdpa.py``, ``clip_sdpa.py``, ``build_linear.py``, plain
torch; ``flash_attn`` and ``easydict``, imported there but not used on the SDPA path, are
stubbed). The reference's decoder is remote code for transformers 4.46 (the hub's
``modeling_deepseekv2.py``), which is not installed beside transformers 5; the decoder here is
transformers' own class in both columns, so the logits compare what the pack adds before it.

What runs, in fp32 on CPU, the pack's ``init:tiny`` weights loaded strictly into both:

* the reference's ``ImageEncoderViT`` (SAM: 4-pixel patches, 4-cell windows, one global layer;
  its ``net_2``/``net_3`` are hard-wired to 256 -> 512 -> 1024 channels, so they are replaced by
  the tiny widths before loading), ``VitModel`` (CLIP with the SAM grid as patches) and
  ``MlpProjector`` (linear), on a 64-pixel global view (no position resizing) and four 40-pixel
  tiles (CLIP's and SAM's position tables resized, SAM's relative positions in the global layer
  resized);
* the reference's feature recipe ``cat(clip[:, 1:], sam.flatten(2).permute(0, 2, 1))`` and
  layout of ``DeepseekOCRForCausalLM._pixel_values_to_embedding`` (tiles' rows with newlines,
  the global view's rows with newlines, the separator), written out here since that file needs vLLM;
* the logits of a prompt whose ``<image>`` slots take either column's image tokens;
* the reference's tiling (``dynamic_preprocess`` and ``find_closest_aspect_ratio`` of
  ``process/image_process.py``, read out of that file: it imports torchvision and a hub tokenizer
  at the top) against :func:`~mm_pack_deepseek_ocr.processing.views` in Gundam mode (640-pixel
  tiles, 2..6 tiles as its vLLM config) on images of several sizes: grids and tile pixels.

Prints max |diff| of each, and the tiling's agreement.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from functools import partial
from pathlib import Path

import torch


class _AttrDict(dict):
    """``easydict.EasyDict`` as the reference uses it (attribute reads, ``get``)."""

    __getattr__ = dict.__getitem__


def reference_modules(folder: Path, config) -> tuple:  # type: ignore[no-untyped-def]
    sys.modules.setdefault("flash_attn", types.SimpleNamespace(flash_attn_qkvpacked_func=None, flash_attn_func=None))
    sys.modules.setdefault("easydict", types.SimpleNamespace(EasyDict=_AttrDict))
    sys.path.insert(0, str(folder))
    from deepencoder.build_linear import MlpProjector
    from deepencoder.clip_sdpa import VitModel
    from deepencoder.sam_vary_sdpa import ImageEncoderViT

    sam_c, clip_c = config.sam_config, config.clip_config
    sam = ImageEncoderViT(
        depth=sam_c.num_hidden_layers,
        embed_dim=sam_c.hidden_size,
        img_size=sam_c.image_size,
        mlp_ratio=4,
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
        num_heads=sam_c.num_attention_heads,
        patch_size=sam_c.patch_size,
        qkv_bias=True,
        use_rel_pos=True,
        global_attn_indexes=list(sam_c.global_attn_indexes),
        window_size=sam_c.window_size,
        out_chans=sam_c.output_channels,
    )
    (c1, c2), out = sam_c.downsample_channels, sam_c.output_channels
    sam.net_2 = torch.nn.Conv2d(out, c1, kernel_size=3, stride=2, padding=1, bias=False)
    sam.net_3 = torch.nn.Conv2d(c1, c2, kernel_size=3, stride=2, padding=1, bias=False)
    clip = VitModel(
        cfg=_AttrDict(
            num_layers=clip_c.num_hidden_layers,
            hidden_size=clip_c.hidden_size,
            num_attention_heads=clip_c.num_attention_heads,
            ffn_hidden_size=clip_c.intermediate_size,
            seq_length=256,
            use_flash_attn=False,
            attention_dropout=0.0,
            layernorm_epsilon=1e-5,
            pre_layernorm_epsilon=1e-5,
            image_size=clip_c.image_size,
            patch_size=clip_c.patch_size,
        )
    )
    projector = MlpProjector(_AttrDict(projector_type="linear", input_dim=config.projector_config["input_dim"], n_embed=config.projector_config["n_embed"]))
    return sam.eval(), clip.eval(), projector.eval()


def public_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def reference_features(sam, clip, projector, pixel_values, tiles, across: int, down: int, newline, separator):  # type: ignore[no-untyped-def]
    def encode(views):  # type: ignore[no-untyped-def]
        a = sam(views)
        b = clip(views, a)
        return projector(torch.cat((b[:, 1:], a.flatten(2).permute(0, 2, 1)), dim=-1))

    glob, local = encode(pixel_values), encode(tiles)
    _, hw, d = glob.shape
    h = int(hw**0.5)
    h2 = int(local.shape[1] ** 0.5)
    g = torch.cat([glob.view(h, h, d), newline[None, None, :].expand(h, 1, d)], dim=1).view(-1, d)
    t = local.view(down, across, h2, h2, d).permute(0, 2, 1, 3, 4).reshape(down * h2, across * h2, d)
    t = torch.cat([t, newline[None, None, :].expand(down * h2, 1, d)], dim=1).view(-1, d)
    return torch.cat([t, g, separator[None, :]], dim=0), glob, local


def reference_tiling(folder: Path) -> dict:
    """``dynamic_preprocess`` and its helper, executed from the reference's source alone."""
    import ast
    import math

    from PIL import Image

    source = (folder / "process" / "image_process.py").read_text()
    wanted = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in ("find_closest_aspect_ratio", "dynamic_preprocess")]
    namespace = {"math": math, "Image": Image, "MIN_CROPS": 2, "MAX_CROPS": 6}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(folder / "process" / "image_process.py"), "exec"), namespace)  # noqa: S102 - the reference's own code, run to compare
    return namespace


def compare_tiling(folder: Path) -> None:
    import numpy as np
    from PIL import Image

    from mm_pack_deepseek_ocr.processing import views

    reference = reference_tiling(folder)
    rng = np.random.default_rng(0)
    sizes = [(700, 500), (1200, 800), (2000, 700), (700, 2000), (1000, 1000), (2000, 2000), (641, 640), (1500, 1100)]
    for width, height in sizes:
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        _, tiles, grid, count = views(image, 1024, 640, True, 16, 2, 6)
        ref_tiles, ref_grid = reference["dynamic_preprocess"](image, image_size=640)
        same = tuple(ref_grid) == grid and len(tiles) == len(ref_tiles) and all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(tiles, ref_tiles))
        print(f"tiling {width} x {height}: grid {grid} (reference {tuple(ref_grid)}), {len(tiles)} tiles, {count} tokens: {'identical' if same else 'DIFFERENT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="the DeepSeek-OCR-vllm folder (holding deepencoder/)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from mm_pack_deepseek_ocr.model import DeepseekOcrForCausalLM
    from mm_pack_deepseek_ocr.tiny import build_init_checkpoint

    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny"
        build_init_checkpoint("tiny", folder, seed=args.seed)
        model = DeepseekOcrForCausalLM.from_pretrained(folder)
        sam, clip, projector = reference_modules(args.reference, model.config)
        weights = public_weights(folder)
        for prefix, module in (("model.sam_model.", sam), ("model.vision_model.", clip), ("model.projector.", projector)):
            state = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
            missing, unexpected = module.load_state_dict(state, strict=False)
            if unexpected or [k for k in missing if k != "embeddings.position_ids"]:  # a buffer the release does not store
                raise SystemExit(f"{prefix}: the public weights do not fit the reference (missing {missing}, unexpected {unexpected})")
    base, tile, across, down = 64, 40, 2, 2
    pixel_values, tiles = torch.randn(1, 3, base, base), torch.randn(across * down, 3, tile, tile)
    crop = torch.tensor([[across, down]])
    with torch.no_grad():
        ref, ref_glob, ref_local = reference_features(sam, clip, projector, pixel_values, tiles, across, down, weights["model.image_newline"], weights["model.view_seperator"])
        ours = model.model.image_features(pixel_values, crop, tiles)
        glob, local = model.model.encode(pixel_values), model.model.encode(tiles)
        ids = torch.tensor([[model.config.text_config.bos_token_id, *[model.config.image_token_id] * ours.shape[0], 40, 41, 42]])
        logits = model(input_ids=ids, pixel_values=pixel_values, images_spatial_crop=crop, pixel_values_local=tiles).logits
        embeds = model.get_input_embeddings()(ids).masked_scatter((ids == model.config.image_token_id)[..., None], ref)
        ref_logits = model(inputs_embeds=embeds).logits
    print(f"image tokens: {ours.shape[0]} (reference {ref.shape[0]}), width {ours.shape[1]}")
    print(f"global view features (SAM+CLIP+projector, no resizing): max |diff| {(glob - ref_glob).abs().max().item():.3e}")
    print(f"tile features (positions resized):                      max |diff| {(local - ref_local).abs().max().item():.3e}")
    print(f"laid-out image tokens:                                  max |diff| {(ours - ref).abs().max().item():.3e}")
    print(f"logits (decoder: transformers' class in both):          max |diff| {(logits - ref_logits).abs().max().item():.3e}")
    compare_tiling(args.reference)


if __name__ == "__main__":
    main()
