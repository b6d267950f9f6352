"""The release's folder layout: strict load, export back, and tiny random checkpoints in it.

``ema.safetensors`` holds the whole model under the reference ``Bagel`` module's names
(``language_model.model.layers.N.self_attn.q_proj_moe_gen.weight``, ``vit_model.vision_model...``,
``connector.fc1.weight``, ``vit_pos_embed.pos_embed``, ``time_embedder.mlp.0.weight``,
``vae2llm.weight``, ``llm2vae.weight``, ``latent_pos_embed.pos_embed``), in bfloat16 in the
release. Loading is strict: a tensor missing, unexpected or of another shape is one line naming
the tensor and the file. Export writes the model's tensors back under the same names, in the
dtype each had in the source file (or the source's dtype for all), and copies the folder's
other files, so BAGEL's own loaders read the result.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from mmcore.errors import StageError
from mm_pack_bagel.config import BAGEL_CONFIG, DEFAULTS, LLM_CONFIG, VAE_WEIGHTS, VIT_CONFIG, WEIGHTS, load_config


def build_model(folder: Path, *, device: str | torch.device = "cpu"):  # type: ignore[no-untyped-def]
    from mm_pack_bagel.model import Bagel

    with torch.device(device):
        return Bagel(load_config(folder))


def check_layout(model: torch.nn.Module, path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The file's tensors (shape, dtype) after checking they are exactly the model's."""
    from safetensors import safe_open

    if not path.is_file():
        raise StageError(f"{path}: missing")
    with safe_open(path, "pt") as f:
        found = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(want) - set(found))
    if missing:
        raise StageError(f"{path}: missing tensor {missing[0]} (and {len(missing) - 1} more)" if len(missing) > 1 else f"{path}: missing tensor {missing[0]}")
    extra = sorted(set(found) - set(want))
    if extra:
        raise StageError(f"{path}: unexpected tensor {extra[0]}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "") + " (not a parameter of BAGEL built from this folder's configs)")
    for key, shape in want.items():
        if found[key][0] != shape:
            raise StageError(f"{path}: tensor {key} has shape {list(found[key][0])}, the configs make it {list(shape)}")
    return {k: (s, _dtype(d)) for k, (s, d) in found.items()}


def _dtype(name: str) -> torch.dtype:
    return {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}.get(name, torch.float32)


def load_model(folder: Path, *, dtype: torch.dtype = torch.float32):  # type: ignore[no-untyped-def]
    """BAGEL with ``ema.safetensors``'s weights, strictly; the VAE is loaded apart (:func:`mm_pack_bagel.vae.load_vae`)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    model = build_model(folder, device="meta")
    check_layout(model, folder / WEIGHTS)
    state = {k: v.to(dtype) for k, v in load_file(str(folder / WEIGHTS)).items()}
    model.load_state_dict(state, strict=True, assign=True)
    for buffer_owner in model.modules():  # non-persistent buffers (RoPE frequencies) are rebuilt off the meta device
        if hasattr(buffer_owner, "inv_freq"):
            fresh = type(buffer_owner)(config=buffer_owner.config)
            buffer_owner.inv_freq = fresh.inv_freq
            buffer_owner.original_inv_freq = fresh.original_inv_freq
    return model


def export(model: torch.nn.Module, source: Path, out: Path) -> Path:
    """Write ``model`` as a release folder at ``out``: ``ema.safetensors`` in the source's
    names and per-tensor dtypes, the configs, tokenizer and ``ae.safetensors`` copied."""
    from safetensors.torch import save_file

    source, out = Path(source), Path(out)
    dtypes = {k: d for k, (_, d) in check_layout(model, source / WEIGHTS).items()}
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name != WEIGHTS and item.is_file():
            shutil.copy2(item, out / item.name)
    state = {k: v.detach().to(dtypes[k]).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS), metadata={"format": "pt"})
    return out


def write_folder(model: torch.nn.Module, vae, tokenizer, out: Path, llm: dict, vit: dict, extra: dict, *, dtype: torch.dtype = torch.bfloat16) -> None:  # type: ignore[no-untyped-def]
    """A release-layout folder from a model, its VAE, tokenizer and the three config dicts."""
    from safetensors.torch import save_file

    from mm_pack_bagel.vae import save_vae

    out.mkdir(parents=True, exist_ok=True)
    (out / LLM_CONFIG).write_text(json.dumps(llm, indent=2))
    (out / VIT_CONFIG).write_text(json.dumps(vit, indent=2))
    (out / BAGEL_CONFIG).write_text(json.dumps({**DEFAULTS, **extra}, indent=2))
    save_file({k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}, str(out / WEIGHTS), metadata={"format": "pt"})
    save_vae(vae, out / VAE_WEIGHTS)
    tokenizer.save_pretrained(out)
