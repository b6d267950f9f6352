"""The public checkpoint's names <-> the composed model's (:mod:`.model`).

Public (``deepseek-ai/deepseek-vl2*``): the SigLIP tower in timm's names (``vision.patch_embed.proj``,
``vision.pos_embed`` [1, patches, width], ``vision.blocks.<i>.{norm1, attn.qkv, attn.proj, norm2,
mlp.fc1, mlp.fc2}``, ``vision.norm``, and the unused attention-pool head ``vision.attn_pool.*``),
``projector.layers.*``, ``image_newline``, ``view_seperator``, ``language.model.*`` (one tensor per
routed expert: ``mlp.experts.<e>.{gate,up,down}_proj``) and ``language.lm_head``.

In memory: transformers' ``SiglipVisionModel`` under ``vision.*`` (``embeddings``, ``encoder.layers``, ``post_layernorm``) (q, k and v apart,
the position embedding an ``nn.Embedding`` [patches, width]), the rest under the public names,
the routed experts fused (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]). The fused
``qkv`` is split in thirds on the way in and joined on the way out; ``pos_embed`` loses and
regains its leading 1. The attention-pool head is left out (the model ignores it, as the
released one does: ``ignore_head``), so exports do not carry it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mmcore.engines import FusedExpertsAdapter, Recipe, TensorInfo

V = "vision"
BLOCK, LAYER = r"^vision\.blocks\.(\d+)\.", rf"^{V}\.encoder\.layers\.(\d+)\."
# (hub pattern, model replacement, model pattern, hub replacement); first match wins.
RULES = [
    (r"^vision\.patch_embed\.proj\.", f"{V}.embeddings.patch_embedding.", rf"^{V}\.embeddings\.patch_embedding\.", "vision.patch_embed.proj."),
    (r"^vision\.pos_embed$", f"{V}.embeddings.position_embedding.weight", rf"^{V}\.embeddings\.position_embedding\.weight$", "vision.pos_embed"),
    (BLOCK + r"norm(\d)\.", rf"{V}.encoder.layers.\1.layer_norm\2.", LAYER + r"layer_norm(\d)\.", r"vision.blocks.\1.norm\2."),
    (BLOCK + r"attn\.proj\.", rf"{V}.encoder.layers.\1.self_attn.out_proj.", LAYER + r"self_attn\.out_proj\.", r"vision.blocks.\1.attn.proj."),
    (BLOCK + r"mlp\.", rf"{V}.encoder.layers.\1.mlp.", LAYER + r"mlp\.", r"vision.blocks.\1.mlp."),
    (r"^vision\.norm\.", f"{V}.post_layernorm.", rf"^{V}\.post_layernorm\.", "vision.norm."),
]
QKV = re.compile(BLOCK + r"attn\.qkv\.(weight|bias)$")
SPLIT = re.compile(LAYER + r"self_attn\.([qkv])_proj\.(weight|bias)$")
POS = "vision.pos_embed"


def _third(tensor: Any, i: int) -> Any:
    return tensor.chunk(3, dim=0)[i].contiguous()


def _joined(q: Any, k: Any, v: Any) -> Any:
    import torch

    return torch.cat([q, k, v])


@dataclass
class DeepseekVL2Names(FusedExpertsAdapter):
    """The rules above, the fused SigLIP ``qkv``, the position embedding's shape, experts per expert."""

    rules: Any = field(default_factory=lambda: list(RULES))
    ignore: Any = field(default_factory=lambda: [r"^vision\.attn_pool\."])
    per_expert: bool = True

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        fused = {k: v for k, v in hf.items() if QKV.match(k)}
        out = super().to_mm({k: v for k, v in hf.items() if k not in fused})
        for key, info in fused.items():
            match = QKV.match(key)
            for i, part in enumerate("qkv"):
                out[f"{V}.encoder.layers.{match[1]}.self_attn.{part}_proj.{match[2]}"] = Recipe((key,), TensorInfo((info.shape[0] // 3, *info.shape[1:]), info.dtype), lambda t, i=i: _third(t, i))
        pos = f"{V}.embeddings.position_embedding.weight"
        if pos in out and len(out[pos].info.shape) == 3:  # the public [1, patches, width]
            shape = out[pos].info.shape[1:]
            out[pos] = Recipe(out[pos].sources, TensorInfo(shape, out[pos].info.dtype), lambda t: t.reshape(shape).contiguous())
        return out

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        parts = {k: v for k, v in mm.items() if SPLIT.match(k)}
        out = super().to_hf({k: v for k, v in mm.items() if k not in parts})
        for key, info in parts.items():
            match = SPLIT.match(key)
            if match[2] == "q":
                sources = tuple(f"{V}.encoder.layers.{match[1]}.self_attn.{p}_proj.{match[3]}" for p in "qkv")
                out[f"vision.blocks.{match[1]}.attn.qkv.{match[3]}"] = Recipe(sources, TensorInfo((3 * info.shape[0], *info.shape[1:]), info.dtype), _joined)
        if POS in out:
            shape = (1, *out[POS].info.shape)
            out[POS] = Recipe(out[POS].sources, TensorInfo(shape, out[POS].info.dtype), lambda t: t.reshape(shape).contiguous())
        return out


def built(recipe: Recipe, tensors: dict[str, Any]) -> Any:
    """The tensor a plan's recipe makes from ``tensors`` (name -> tensor)."""
    sources = [tensors[k] for k in recipe.sources]
    return recipe.combine(*sources) if recipe.combine else sources[0]


ADAPTER = DeepseekVL2Names()

__all__ = ["ADAPTER", "DeepseekVL2Names", "RULES", "built"]
