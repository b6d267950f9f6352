"""Kimi-K2.5's checkpoint names: the released layout (Moonshot's remote-code model, one tensor per
expert) <-> transformers' model.

The released names, as transformers' conversion mapping for ``kimi_k25`` reads them (with the
``qwen2_moe`` rules it appends for the experts): ``vision_tower.patch_embed.*``,
``vision_tower.encoder.blocks.<i>.{norm0,norm1,wqkv,wo,mlp.fc0,mlp.fc1}``,
``vision_tower.encoder.final_layernorm``, ``mm_projector.{pre_norm,proj.0,proj.2}``,
``language_model.model.layers.*`` (``mlp.experts.<e>.{gate,up,down}_proj``) and
``language_model.lm_head``. The vision attention's ``wqkv`` is fused and its q and k rows are in
the complex (interleaved-pair) RoPE order: split and permuted per head to transformers'
rotate-half order on the way in (``Chunk`` + ``PermuteForRope``), and back on the way out.

Also read as they are written: transformers' ``save_pretrained`` layout, which reverses the
mapping's generic ``blocks -> layers`` rule onto the decoder too (``language_model.model.blocks.*``)
and keeps ``vision_tower.encoder.patch_embed`` / ``model.mm_projector.pre_norm``; and the in-memory
names (no rule matches them). Exports have the released layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mmcore.engines import FusedExpertsAdapter
from mmcore.engines import Recipe, TensorInfo

VT = "model.vision_tower"
BLOCK = r"^vision_tower\.encoder\.blocks\.(\d+)\."
LAYER = rf"^{VT}\.layers\.(\d+)\."
# (hub pattern, model replacement, model pattern, hub replacement); first match wins.
RULES = [
    (BLOCK + r"norm0\.", rf"{VT}.layers.\1.norm1.", LAYER + r"norm1\.", r"vision_tower.encoder.blocks.\1.norm0."),
    (BLOCK + r"norm1\.", rf"{VT}.layers.\1.norm2.", LAYER + r"norm2\.", r"vision_tower.encoder.blocks.\1.norm1."),
    (BLOCK + r"mlp\.fc0\.", rf"{VT}.layers.\1.mlp.fc1.", LAYER + r"mlp\.fc1\.", r"vision_tower.encoder.blocks.\1.mlp.fc0."),
    (BLOCK + r"mlp\.fc1\.", rf"{VT}.layers.\1.mlp.fc2.", LAYER + r"mlp\.fc2\.", r"vision_tower.encoder.blocks.\1.mlp.fc1."),
    (BLOCK + r"wo\.", rf"{VT}.layers.\1.attn.proj.", LAYER + r"attn\.proj\.", r"vision_tower.encoder.blocks.\1.wo."),
    (r"^vision_tower\.encoder\.final_layernorm\.", f"{VT}.final_layernorm.", rf"^{VT}\.final_layernorm\.", "vision_tower.encoder.final_layernorm."),
    (r"^vision_tower\.(encoder\.)?patch_embed\.proj\.", f"{VT}.patch_embed.proj.", rf"^{VT}\.patch_embed\.proj\.", "vision_tower.patch_embed.proj."),
    (
        r"^vision_tower\.patch_embed\.pos_emb\.weight$",
        f"{VT}.patch_embed.pos_emb.position_embeddings",
        rf"^{VT}\.patch_embed\.pos_emb\.position_embeddings$",
        "vision_tower.patch_embed.pos_emb.weight",
    ),
    (r"^(model\.)?mm_projector\.pre_norm\.", "model.mm_projector.pre_norm.", r"^model\.mm_projector\.pre_norm\.", "mm_projector.pre_norm."),
    (r"^mm_projector\.proj\.0\.", "model.mm_projector.in_proj.", r"^model\.mm_projector\.in_proj\.", "mm_projector.proj.0."),
    (r"^mm_projector\.proj\.2\.", "model.mm_projector.out_proj.", r"^model\.mm_projector\.out_proj\.", "mm_projector.proj.2."),
    (r"^language_model\.model\.(layers|blocks)\.", "model.language_model.layers.", r"^model\.language_model\.layers\.", "language_model.model.layers."),
    (r"^language_model\.model\.", "model.language_model.", r"^model\.language_model\.", "language_model.model."),
    (r"^language_model\.lm_head\.", "lm_head.", r"^lm_head\.", "language_model.lm_head."),
]
WQKV = re.compile(BLOCK + r"wqkv\.(weight|bias)$")
QKV = re.compile(LAYER + r"attn\.([qkv])_proj\.(weight|bias)$")


def rope_permute(tensor: Any, heads: int, inverse: bool = False) -> Any:
    """transformers' ``PermuteForRope``: per head, interleaved (re, im) pairs -> two halves
    (``inverse``: halves -> pairs). Rows of a weight or entries of a bias."""
    rows = tensor.shape[0]
    half = rows // heads // 2
    shape = (heads, 2, half) if inverse else (heads, half, 2)
    return tensor.reshape(*shape, *tensor.shape[1:]).transpose(1, 2).reshape(tensor.shape).contiguous()


@dataclass
class KimiK25Names(FusedExpertsAdapter):
    """The rules above, the fused ``wqkv`` (``vision_heads``: the vision config's
    ``num_attention_heads``, which the permutation needs and shapes do not tell), and LoRA
    adapter keys under the hub's names: peft (with transformers 5) renames adapter keys by the
    family's conversion mapping on load, whose ``blocks -> layers`` and ``language_model.model ->
    model.language_model`` rules only leave keys in the released layout where they belong."""

    vision_heads: int = 0

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        fused = {k: v for k, v in hf.items() if WQKV.match(k)}
        out = super().to_mm({k: v for k, v in hf.items() if k not in fused})
        for key, info in fused.items():
            match = WQKV.match(key)
            third = info.shape[0] // 3
            for i, part in enumerate("qkv"):
                permute = part != "v"
                out[f"{VT}.layers.{match[1]}.attn.{part}_proj.{match[2]}"] = Recipe((key,), TensorInfo((third, *info.shape[1:]), info.dtype), lambda t, i=i, p=permute: self._split(t, i, p))
        return out

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        parts = {k: v for k, v in mm.items() if QKV.match(k)}
        out = super().to_hf({k: v for k, v in mm.items() if k not in parts})
        for key, info in parts.items():
            match = QKV.match(key)
            if match[2] == "q":
                sources = tuple(f"{VT}.layers.{match[1]}.attn.{p}_proj.{match[3]}" for p in "qkv")
                out[f"vision_tower.encoder.blocks.{match[1]}.wqkv.{match[3]}"] = Recipe(sources, TensorInfo((3 * info.shape[0], *info.shape[1:]), info.dtype), self._fuse)
        return out

    def _heads(self) -> int:
        if self.vision_heads <= 0:
            raise ValueError("KimiK25Names needs vision_heads (the vision config's num_attention_heads): use adapter_for(config)")
        return self.vision_heads

    def _split(self, tensor: Any, i: int, permute: bool) -> Any:
        part = tensor.chunk(3, dim=0)[i]
        return rope_permute(part, self._heads()) if permute else part.contiguous()

    def _fuse(self, q: Any, k: Any, v: Any) -> Any:
        import torch

        heads = self._heads()
        return torch.cat([rope_permute(q, heads, inverse=True), rope_permute(k, heads, inverse=True), v])

    def peft_name(self, model_key: str) -> str:
        return self._rename(model_key, False)
