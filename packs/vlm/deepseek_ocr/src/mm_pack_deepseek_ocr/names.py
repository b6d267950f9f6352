"""The public checkpoint's names <-> the composed model's (:mod:`.model`).

Public (``deepseek-ai/DeepSeek-OCR``, one ``model-00001-of-000001.safetensors``, 2710 tensors):
``model.sam_model.*`` in SAM's own names (``patch_embed.proj``, ``pos_embed`` [1, 64, 64, 768],
``blocks.<i>.{norm1, attn.qkv, attn.proj, attn.rel_pos_h/w, norm2, mlp.lin1, mlp.lin2}``,
``neck.0-3``, ``net_2``, ``net_3``), ``model.vision_model.*`` (``embeddings.{class_embedding,
patch_embedding, position_embedding}``, ``pre_layrnorm``, ``transformer.layers.<i>.{layer_norm1,
self_attn.qkv_proj, self_attn.out_proj, layer_norm2, mlp.fc1, mlp.fc2}``), ``model.projector.layers``,
``model.image_newline``, ``model.view_seperator``, the decoder at ``model.{embed_tokens, layers,
norm}`` (one tensor per routed expert: ``mlp.experts.<e>.{gate,up,down}_proj``) and ``lm_head``.

In memory: transformers' SAM under ``model.sam_model`` (``layers``, ``layer_norm1``,
``patch_embed.projection``, ``neck.conv1/layer_norm1/conv2/layer_norm2``, ``proj.conv1/conv2``),
the CLIP layers with q, k and v apart (the public fused ``qkv_proj`` split in thirds on the way in,
joined on the way out), the decoder under ``model.language_model`` with the routed experts fused
(``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]); every other name is the public one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcore.engines import FusedExpertsAdapter, Recipe, TensorInfo

SAM = "model.sam_model"
# (hub pattern, model replacement, model pattern, hub replacement); first match wins; names no
# rule matches are the same in both.
RULES = [
    (rf"^{SAM}\.blocks\.(\d+)\.norm(\d)\.", rf"{SAM}.layers.\1.layer_norm\2.", rf"^{SAM}\.layers\.(\d+)\.layer_norm(\d)\.", rf"{SAM}.blocks.\1.norm\2."),
    (rf"^{SAM}\.blocks\.", f"{SAM}.layers.", rf"^{SAM}\.layers\.", f"{SAM}.blocks."),
    (rf"^{SAM}\.patch_embed\.proj\.", f"{SAM}.patch_embed.projection.", rf"^{SAM}\.patch_embed\.projection\.", f"{SAM}.patch_embed.proj."),
    (rf"^{SAM}\.neck\.0\.", f"{SAM}.neck.conv1.", rf"^{SAM}\.neck\.conv1\.", f"{SAM}.neck.0."),
    (rf"^{SAM}\.neck\.1\.", f"{SAM}.neck.layer_norm1.", rf"^{SAM}\.neck\.layer_norm1\.", f"{SAM}.neck.1."),
    (rf"^{SAM}\.neck\.2\.", f"{SAM}.neck.conv2.", rf"^{SAM}\.neck\.conv2\.", f"{SAM}.neck.2."),
    (rf"^{SAM}\.neck\.3\.", f"{SAM}.neck.layer_norm2.", rf"^{SAM}\.neck\.layer_norm2\.", f"{SAM}.neck.3."),
    (rf"^{SAM}\.net_2\.", f"{SAM}.proj.conv1.", rf"^{SAM}\.proj\.conv1\.", f"{SAM}.net_2."),
    (rf"^{SAM}\.net_3\.", f"{SAM}.proj.conv2.", rf"^{SAM}\.proj\.conv2\.", f"{SAM}.net_3."),
    (r"^model\.(embed_tokens|layers|norm)\.", r"model.language_model.\1.", r"^model\.language_model\.", "model."),
]
CLIP = r"^model\.vision_model\.transformer\.layers\.(\d+)\.self_attn\."
QKV = re.compile(CLIP + r"qkv_proj\.(weight|bias)$")
SPLIT = re.compile(CLIP + r"([qkv])_proj\.(weight|bias)$")


def _third(tensor: Any, i: int) -> Any:
    return tensor.chunk(3, dim=0)[i].contiguous()


def _joined(q: Any, k: Any, v: Any) -> Any:
    import torch

    return torch.cat([q, k, v])


@dataclass
class DeepseekOcrNames(FusedExpertsAdapter):
    """The rules above, CLIP's fused ``qkv_proj``, experts one tensor each in the files."""

    rules: Any = field(default_factory=lambda: list(RULES))
    per_expert: bool = True

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        fused = {k: v for k, v in hf.items() if QKV.match(k)}
        out = super().to_mm({k: v for k, v in hf.items() if k not in fused})
        for key, info in fused.items():
            match = QKV.match(key)
            for i, part in enumerate("qkv"):
                name = f"model.vision_model.transformer.layers.{match[1]}.self_attn.{part}_proj.{match[2]}"
                out[name] = Recipe((key,), TensorInfo((info.shape[0] // 3, *info.shape[1:]), info.dtype), lambda t, i=i: _third(t, i))
        return out

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        parts = {k: v for k, v in mm.items() if SPLIT.match(k)}
        out = super().to_hf({k: v for k, v in mm.items() if k not in parts})
        for key, info in parts.items():
            match = SPLIT.match(key)
            if match[2] == "q":
                sources = tuple(f"model.vision_model.transformer.layers.{match[1]}.self_attn.{p}_proj.{match[3]}" for p in "qkv")
                out[f"model.vision_model.transformer.layers.{match[1]}.self_attn.qkv_proj.{match[3]}"] = Recipe(sources, TensorInfo((3 * info.shape[0], *info.shape[1:]), info.dtype), _joined)
        return out


def built(recipe: Recipe, tensors: dict[str, Any]) -> Any:
    """The tensor a plan's recipe makes from ``tensors`` (name -> tensor)."""
    sources = [tensors[k] for k in recipe.sources]
    return recipe.combine(*sources) if recipe.combine else sources[0]


def load_public(folder: Path) -> dict[str, Any]:
    """The model's state dict from a folder's safetensors in the public names."""
    from safetensors import safe_open

    tensors: dict[str, Any] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    plan = DeepseekOcrNames().to_mm({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in tensors.items()})
    return {k: built(r, tensors) for k, r in plan.items()}


def save_public(model: Any, out: Path) -> None:
    """The model's weights in the public names (``model.safetensors``)."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    plan = DeepseekOcrNames().to_hf({k: TensorInfo(tuple(v.shape), v.dtype) for k, v in state.items()})
    save_file({k: built(r, state).contiguous() for k, r in plan.items()}, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})


ADAPTER = DeepseekOcrNames()

__all__ = ["ADAPTER", "DeepseekOcrNames", "RULES", "built", "load_public", "save_public"]
