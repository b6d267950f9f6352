"""The release's folder: strict load, export back, and the folder writer ``init:`` uses.

``inclusionAI/Ming-Lite-Omni`` is a transformers folder: ``config.json``, sharded
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json`` (or one
``model.safetensors``), the tokenizer and processor files, and subfolders (the talker's
``talker/``, the audio frontend's files) that this pack copies without reading.

Loading is strict: every tensor of the model built from ``config.json`` must be in the files
under its name and shape, and every tensor in the files must be one of them, except those under
:data:`KEPT_PREFIXES` (the talker's, out of this pack's scope): those are kept as they are and written back unchanged by :func:`export`. A tensor
missing, unexpected or misshapen is one line naming it and its file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from mmcore.errors import StageError
from mm_pack_ming.config import CONFIG, load_config

INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"
# The part of BailingMMNativeForConditionalGeneration this pack does not build: the speech head
# (``talker.*``, the reference's ``self.talker``). The snapshot's modeling code has no image
# generation head; a release that adds one needs its module prefixes added here.
KEPT_PREFIXES = ("talker.",)


def build_model(folder: Path, *, device: str | torch.device = "cpu"):  # type: ignore[no-untyped-def]
    from mm_pack_ming.model import MingOmni

    with torch.device(device):
        return MingOmni(load_config(folder))


def shard_map(folder: Path) -> dict[str, str]:
    """Tensor name -> the file (relative to ``folder``) that holds it."""
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise StageError(f"{index}: not a safetensors index (a JSON object with weight_map)") from None
        for name in sorted(set(weight_map.values())):
            if not (folder / name).is_file():
                raise StageError(f"{index}: names {name}, which is missing from {folder}")
        return dict(weight_map)
    if (folder / SINGLE).is_file():
        with safe_open(folder / SINGLE, "pt") as f:
            return {k: SINGLE for k in f.keys()}
    raise StageError(f"{folder}: no {INDEX} or {SINGLE} (Ming-Lite-Omni's weights)")


def file_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Name -> (file, shape, dtype name) of every tensor in the folder's weight files,
    checked against the index (a tensor the index places in a file that lacks it: one line)."""
    from safetensors import safe_open

    where = shard_map(folder)
    found: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for name in sorted(set(where.values())):
        with safe_open(Path(folder) / name, "pt") as f:
            for key in f.keys():
                s = f.get_slice(key)
                found[key] = (name, tuple(s.get_shape()), s.get_dtype())
    for key, name in where.items():
        if key not in found:
            raise StageError(f"{Path(folder) / name}: missing tensor {key} (listed in {INDEX})")
    return found


def kept(key: str) -> bool:
    return key.startswith(KEPT_PREFIXES)


def check_layout(model: torch.nn.Module, folder: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """The folder's tensors after checking they are exactly the model's (plus kept ones)."""
    found = file_tensors(folder)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(want) - set(found))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise StageError(f"{folder}: missing tensor {missing[0]}{more} (the model {Path(folder) / CONFIG} describes has it)")
    extra = sorted(k for k in set(found) - set(want) if not kept(k))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise StageError(f"{Path(folder) / found[extra[0]][0]}: unexpected tensor {extra[0]}{more} (not a parameter of the model {CONFIG} describes)")
    for key, shape in want.items():
        if found[key][1] != shape:
            raise StageError(f"{Path(folder) / found[key][0]}: tensor {key} has shape {list(found[key][1])}, {CONFIG} makes it {list(shape)}")
    return found


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def load_model(folder: Path, *, dtype: torch.dtype = torch.float32):  # type: ignore[no-untyped-def]
    """The model with the folder's weights, strictly, in ``dtype``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    model = build_model(folder, device="meta")
    found = check_layout(model, folder)
    state: dict[str, torch.Tensor] = {}
    for name in sorted({f for f, _, _ in found.values()}):
        state.update({k: v.to(dtype) for k, v in load_file(str(folder / name)).items() if not kept(k)})
    model.load_state_dict(state, strict=True, assign=True)
    rebuild_buffers(model)
    return model


def rebuild_buffers(model: torch.nn.Module) -> None:
    """Non-persistent buffers (the vision tower's rotary frequencies) off the meta device."""
    rotary = model.vision.rotary_pos_emb
    fresh = type(rotary)(model.vision.config)
    for name, buffer in fresh.named_buffers():
        setattr(rotary, name, buffer)


def export(model: torch.nn.Module, source: Path, out: Path) -> Path:
    """Write ``model`` as a release folder at ``out``: each tensor in the file and dtype the
    source folder has it in, the kept tensors copied unchanged, the index and every other
    file and subfolder copied."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    source, out = Path(source), Path(out)
    found = check_layout(model, source)
    out.mkdir(parents=True, exist_ok=True)
    weights = {f for f, _, _ in found.values()}
    for item in source.iterdir():
        if item.name in weights or item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, out / item.name, dirs_exist_ok=True)
        else:
            shutil.copy2(item, out / item.name)
    state = model.state_dict()
    for name in sorted(weights):
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(source / name, "pt") as f:
            metadata = f.metadata() or {"format": "pt"}
            for key in f.keys():
                if kept(key):
                    tensors[key] = f.get_tensor(key)
                else:
                    tensors[key] = state[key].detach().to(DTYPES.get(found[key][2], torch.float32)).contiguous()
        save_file(tensors, str(out / name), metadata=metadata)
    return out


def write_folder(model: torch.nn.Module, config: dict[str, Any], out: Path, *, shards: int = 2, dtype: torch.dtype = torch.bfloat16, extra: dict[str, torch.Tensor] | None = None) -> None:
    """A release-layout folder: ``config.json``, ``shards`` weight files and their index.
    ``extra`` (kept tensors: a talker's) go into the last shard as they are."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(json.dumps(config, indent=2))
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    state.update(extra or {})
    keys = list(state)
    per = -(-len(keys) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[i * per : (i + 1) * per]}
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
        total += sum(v.numel() * v.element_size() for v in part.values())
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
