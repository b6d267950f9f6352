"""Reading and writing Step-Video VAE folders (:class:`mm_pack_stepvideo.stepvae.StepVideoVAE`).

The released layout (hub ``stepfun-ai/stepvideo-t2v``, ``vae/``) is two safetensors files and no
config: the reference (``api/call_remote_server.py``) builds version 2 with 64 channels for
``vae_v2.safetensors`` (what it serves) and version 1 with 16 for ``vae.safetensors``, every
other size at its classes' defaults. So a folder without ``config.json`` is read as that: its
``vae_v2.safetensors`` if there, else its ``vae.safetensors``. A ``config.json`` (``_class_name``
``StepVideoVAE``; other sizes, e.g. the tiny test models) takes precedence, and the weights are
then ``vae_v2.safetensors`` / ``vae.safetensors`` (whichever matches its ``version``) or
``save_pretrained``'s ``diffusion_pytorch_model.safetensors``. The tensor names are the files'
(the reference renames ``decoder.conv_out.*`` to ``decoder.conv_out.conv.*`` on loading; this
model's names need no renaming).

Loading is strict: every tensor must be there under its name and shape, none other; anything
else is one line naming the file, the counts and an example of each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmcore.engines import load_strictly

RELEASED = {2: "vae_v2.safetensors", 1: "vae.safetensors"}
RELEASED_SIZES = {2: {"version": 2, "z_channels": 64}, 1: {"version": 1, "z_channels": 16}}
SAFETENSORS = "diffusion_pytorch_model.safetensors"
CLASS_NAME = "StepVideoVAE"
DESCRIBED = "the Step-Video VAE its config describes"


def is_stepvae_folder(folder: Path) -> bool:
    """A ``config.json`` naming :class:`StepVideoVAE`, or no config and a released weights file."""
    config = folder / "config.json"
    if not config.is_file():
        return any((folder / name).is_file() for name in RELEASED.values())
    try:
        return json.loads(config.read_text()).get("_class_name") == CLASS_NAME
    except (OSError, ValueError):
        return False


def folder_config(folder: Path) -> dict[str, Any]:
    """The folder's config: its ``config.json``, or the reference's sizes for the released file it holds."""
    if (folder / "config.json").is_file():
        from mm_pack_stepvideo.stepvae import StepVideoVAE

        try:
            return dict(StepVideoVAE.load_config(folder))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{folder / 'config.json'}: not a readable Step-Video VAE config ({type(exc).__name__})") from None
    for version, name in RELEASED.items():
        if (folder / name).is_file():
            return dict(RELEASED_SIZES[version])
    raise ValueError(f"{folder}: a Step-Video VAE folder needs {RELEASED[2]} (or {RELEASED[1]}), or a config.json")


def weights_file(folder: Path, config: dict[str, Any]) -> Path:
    for name in (RELEASED.get(config.get("version", 2), RELEASED[2]), SAFETENSORS):
        if (folder / name).is_file():
            return folder / name
    raise ValueError(f"{folder}: no Step-Video VAE weights ({RELEASED.get(config.get('version', 2), RELEASED[2])} or {SAFETENSORS})")


def build(folder: Path, config: dict[str, Any], device: Any = None) -> Any:
    import torch

    from mm_pack_stepvideo.stepvae import StepVideoVAE

    try:
        with torch.device(device or "cpu"):
            return StepVideoVAE.from_config(config)
    except (TypeError, ValueError) as exc:  # the model's own config checks, named by field
        where = folder / "config.json" if (folder / "config.json").is_file() else folder
        raise ValueError(f"{where}: {exc}") from None


def read_tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as exc:  # a truncated file or not safetensors at all
        raise ValueError(f"{path}: unreadable as safetensors ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def meta_tensors(path: Path) -> dict[str, Any]:
    """A safetensors file's tensors as empty ones of their shapes (the header only read)."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in f.keys()}
    except Exception as exc:
        raise ValueError(f"{path}: unreadable as safetensors ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def check_stepvae_folder(folder: Path) -> None:
    """The folder's weights fit its config (names, shapes), read from the file's header onto a model on the meta device."""
    config = folder_config(folder)
    path = weights_file(folder, config)
    load_strictly(build(folder, config, "meta"), meta_tensors(path), path, DESCRIBED, error=ValueError, assign=True)


def load_stepvae(folder: Path, dtype: Any = None) -> Any:
    """A :class:`StepVideoVAE` from ``folder``, strictly, in eval mode (``dtype``: cast after loading)."""
    config = folder_config(folder)
    path = weights_file(folder, config)
    model = build(folder, config)
    tensors = read_tensors(path)
    load_strictly(model, tensors, path, DESCRIBED, error=ValueError)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def save_released(model: Any, folder: Path, with_config: bool = True) -> None:
    """``model`` in the release's layout: its tensors as ``vae_v2.safetensors`` (version 1:
    ``vae.safetensors``), and (``with_config``) a ``config.json``, which the released folder lacks
    and a model of other than the released sizes needs."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if with_config:
        model.save_config(folder)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, folder / RELEASED[model.config.version])


def check_pipeline_vae(folder: Path) -> None:
    """The download stage's check (``check_parts``): where the pipeline folder's ``vae/`` is Step-Video's own (the released ``vae_v2.safetensors``, or a ``config.json`` naming ``StepVideoVAE``), its weights fit its config (check_stepvae_folder); any other ``vae/`` is left to diffusers."""
    if is_stepvae_folder(folder / "vae"):
        check_stepvae_folder(folder / "vae")
