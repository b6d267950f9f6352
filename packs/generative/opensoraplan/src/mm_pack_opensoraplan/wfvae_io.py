"""Reading and writing WF-VAE folders (:class:`mm_pack_opensoraplan.wfvae.WFVAEModel`).

The released layout (hub ``LanguageBind/Open-Sora-Plan-v1.5.0``, ``vae/``) is the reference's
(PKU-YuanGroup/WF-VAE ``VideoBaseAE.from_pretrained``): ``config.json`` (``WFVAEModel``'s fields)
and a ``*.ckpt`` torch pickle. The reference's trainer saves its tensors either under
``ema_state_dict`` (data-parallel ``module.`` names; only trainable parameters, so no Haar
filters) or under ``state_dict`` -> ``gen_model`` (the whole state dict), and its loader takes
the EMA one where it is non-empty: so does this one. ``save_pretrained``'s layout
(``diffusion_pytorch_model.safetensors``) reads the same way.

Loading is strict: every trainable tensor must be there under its name and shape; the Haar
filters are constants of the architecture (0.3536 = 1/sqrt(8) rounded, as the reference fixes
them), so they may be absent, and where present must have their shape. Anything else is one line
naming the folder, the counts and an example of each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RELEASED_CHECKPOINT = "checkpoint.ckpt"
SAFETENSORS = "diffusion_pytorch_model.safetensors"


def is_wfvae_folder(folder: Path) -> bool:
    try:
        return json.loads((folder / "config.json").read_text()).get("_class_name") == "WFVAEModel"
    except (OSError, ValueError):
        return False


def weights_file(folder: Path) -> Path:
    if (folder / SAFETENSORS).is_file():
        return folder / SAFETENSORS
    ckpts = sorted(folder.glob("*.ckpt"))
    if len(ckpts) != 1:
        raise ValueError(f"{folder}: a WF-VAE folder needs one *.ckpt (the released {RELEASED_CHECKPOINT}) or {SAFETENSORS}; found {[p.name for p in ckpts] or 'none'}")
    return ckpts[0]


def released_tensors(saved: Any, where: Path) -> dict[str, Any]:
    """The flat state dict inside a reference checkpoint pickle (see the module's docstring)."""
    if isinstance(saved, dict) and saved.get("ema_state_dict"):
        return {k.replace("module.", ""): v for k, v in saved["ema_state_dict"].items()}
    if isinstance(saved, dict) and isinstance(saved.get("state_dict"), dict):
        inner = saved["state_dict"]
        return inner["gen_model"] if isinstance(inner.get("gen_model"), dict) else inner
    if isinstance(saved, dict) and all(hasattr(v, "shape") for v in saved.values()):
        return saved
    raise ValueError(f"{where}: not a WF-VAE checkpoint (no ema_state_dict, state_dict or flat tensors)")


def read_tensors(path: Path, mmap: bool = False) -> dict[str, Any]:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    try:
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            saved = torch.load(path, map_location="cpu", weights_only=True)  # a pickle of the legacy format cannot be mapped
    except Exception as exc:  # a pickle of objects other than tensors and containers, or garbage
        raise ValueError(f"{path}: unreadable as a checkpoint of tensors ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    return released_tensors(saved, path)


def constant_names(model: Any) -> set[str]:
    """The state dict's Haar filters (constants: may be absent from a checkpoint)."""
    from mm_pack_opensoraplan.wfvae_blocks import HaarWaveletTransform3D, InverseHaarWaveletTransform3D

    out = set()
    for prefix, module in model.named_modules():
        if isinstance(module, (HaarWaveletTransform3D, InverseHaarWaveletTransform3D)):
            out.update(f"{prefix}.{name}" for name in module.state_dict())
    return out


def check_tensors(model: Any, tensors: dict[str, Any], where: Path) -> None:
    """One ValueError line naming ``where`` if ``tensors`` do not fit ``model`` strictly."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(tensors) - constant_names(model))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = sorted(k for k in set(tensors) & set(expected) if tuple(tensors[k].shape) != expected[k])
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        if shapes:
            k = shapes[0]
            parts.append(f"{len(shapes)} of another shape (e.g. {k}: {list(tensors[k].shape)}, the config needs {list(expected[k])})")
        raise ValueError(f"{where}: the WF-VAE weights do not fit its config.json: {'; '.join(parts)}")


def build(folder: Path, device: Any = None) -> Any:
    from mm_pack_opensoraplan.wfvae import WFVAEModel

    try:
        config = WFVAEModel.load_config(folder)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: no readable WF-VAE config.json ({type(exc).__name__})") from None
    import torch

    try:
        with torch.device(device or "cpu"):
            return WFVAEModel.from_config(config)
    except ValueError as exc:  # the model's own config checks, named by field
        raise ValueError(f"{folder / 'config.json'}: {exc}") from None


def check_wfvae_folder(folder: Path) -> None:
    """The folder's weights fit its config (names, shapes), read without copying them (mmap), the model built on the meta device."""
    check_tensors(build(folder, "meta"), read_tensors(weights_file(folder), mmap=True), weights_file(folder))


def load_wfvae(folder: Path, dtype: Any = None) -> Any:
    """A :class:`WFVAEModel` from ``folder``, strictly, in eval mode (``dtype``: cast after loading)."""
    path = weights_file(folder)
    model = build(folder)
    tensors = read_tensors(path)
    check_tensors(model, tensors, path)
    model.load_state_dict(tensors, strict=False)  # strictness checked above: only constants may be absent
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def save_released(model: Any, folder: Path, ema: bool = False) -> None:
    """``model`` as the reference's trainer leaves it: ``config.json`` and ``checkpoint.ckpt``, the
    whole state dict under ``state_dict`` -> ``gen_model``, or (``ema``) only the trainable
    parameters under ``ema_state_dict`` with data-parallel ``module.`` names."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    model.save_config(folder)
    if ema:
        saved: dict[str, Any] = {"ema_state_dict": {f"module.{k}": v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}}
    else:
        saved = {"state_dict": {"gen_model": {k: v.clone() for k, v in model.state_dict().items()}}}
    torch.save(saved, folder / RELEASED_CHECKPOINT)


def check_pipeline_vae(folder: Path) -> None:
    """The download stage's check (``check_parts``): where the pipeline folder's ``vae/`` is a WF-VAE (the released model's VAE), its weights fit its config (check_wfvae_folder); any other ``vae/`` is left to diffusers."""
    if is_wfvae_folder(folder / "vae"):
        check_wfvae_folder(folder / "vae")
