"""LoRA exports: :func:`write_peft_adapter` writes the folder ``PeftModel.from_pretrained(base, dir)``
(and transformers' ``from_pretrained(dir)``) loads; :func:`diffusers_lora_state` the keys
diffusers' ``load_lora_weights`` reads; :func:`merged_state` the base weights with the adapters
merged (in fp32); :func:`load_adapter_folder` / :func:`with_adapters` read such a folder back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmcore.errors import StageError
from mmcore.train.lora import ADAPTER, LoraPlan, base_key, is_adapter, trained_names

if TYPE_CHECKING:
    import torch
    from torch import nn


def adapter_tensors(model: "nn.Module", plan: LoraPlan) -> dict[str, "torch.Tensor"]:
    """The trained tensors under peft's saved names (``X.lora_A.weight``, ``M.weight`` of a
    module to save), without the ``base_model.model.`` prefix."""
    state = model.state_dict()
    out = {}
    for key in trained_names(model, plan):
        name = key.replace(f".{ADAPTER}.", ".") if is_adapter(key) else (base_key(key) or key)
        out[name] = state[key].detach().to("cpu").clone()  # a copy: tied weights saved under both names
    return out


def save_peft_config(config: Any, folder: Path) -> None:
    """``folder/adapter_config.json`` as peft writes it, with its sets (``target_modules``) as
    sorted lists: peft lists a set in the order of the process's string hashing, so the same
    run would otherwise write another file each time."""
    config.save_pretrained(str(folder))
    sets = [key for key, value in config.to_dict().items() if isinstance(value, set)]
    path = Path(folder) / "adapter_config.json"
    written = json.loads(path.read_text())
    for key in sets:
        written[key] = sorted(written[key])
    path.write_text(json.dumps(written, indent=2, sort_keys=True))  # peft's own layout


def write_peft_adapter(model: "nn.Module", plan: LoraPlan, folder: Path, *, base_model: Path, dtype: Any = None, rename: Any = None) -> dict[str, Any]:
    """``folder/adapter_config.json`` + ``adapter_model.safetensors`` as peft saves them.

    ``rename``: model name -> the name peft reads, for a family whose transformers conversion
    mapping peft also applies to adapter keys on load (so they are written under the hub's names).
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    named = rename or (lambda key: key)
    tensors = {f"base_model.model.{named(k)}": (v.to(dtype) if dtype is not None and v.is_floating_point() else v) for k, v in adapter_tensors(model, plan).items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    save_peft_config(plan.peft_config(str(Path(base_model).resolve())), folder)
    return {"adapter_tensors": len(tensors), "adapter_parameters": int(sum(t.numel() for t in tensors.values()))}


def diffusers_lora_state(model: "nn.Module", plan: LoraPlan, dtype: Any = None) -> dict[str, "torch.Tensor"]:
    """Adapter tensors under diffusers' names for a pipeline's ``transformer``."""
    if plan.modules_to_save:
        raise StageError("diffusers' load_lora_weights does not load modules_to_save: set export.merge_lora: true to export them merged")
    return {k: (v.to(dtype) if dtype is not None else v) for k, v in adapter_tensors(model, plan).items()}


def merged_state(model: "nn.Module") -> dict[str, "torch.Tensor"]:
    """The base model's state with every adapter merged into its layer (in fp32, peft's
    ``merge``), under the base model's names. Merges ``model`` in place."""
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer) and not module.merged:
            module.merge(safe_merge=True)
    state: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        name = base_key(key)
        if name is not None:
            state[name] = value
    return state


def load_adapter_folder(load_base: Any, folder: Path, base: Path | None = None) -> Any:
    """A transformers model with the peft adapter of ``folder`` (unmerged: it computes as the
    trained model did). ``base`` defaults to the folder's ``base_model_name_or_path``."""
    from peft import PeftModel

    import warnings

    config = json.loads((Path(folder) / "adapter_config.json").read_text())
    base_dir = Path(base) if base is not None else Path(config.get("base_model_name_or_path") or "")
    if not (base_dir / "config.json").is_file():
        raise StageError(f"{folder}: the adapter's base model {str(base_dir)!r} is not a local model folder")
    with warnings.catch_warnings():  # peft asks transformers a deprecated question while loading
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return PeftModel.from_pretrained(load_base(base_dir), str(folder)).get_base_model()


def is_adapter_folder(folder: Path) -> bool:
    return (Path(folder) / "adapter_config.json").is_file()


def with_adapters(load: Any) -> Any:
    """``load(folder) -> model`` that also takes a peft adapter folder (loaded on its base)."""

    def load_any(folder: Path) -> Any:
        return load_adapter_folder(load, folder) if is_adapter_folder(folder) else load(folder)

    return load_any


__all__ = ["adapter_tensors", "save_peft_config", "write_peft_adapter", "diffusers_lora_state", "merged_state", "load_adapter_folder", "is_adapter_folder", "with_adapters"]
