"""Lumina-mGPT's checkpoints <-> transformers' Chameleon layout.

Every tensor of the public Lumina-mGPT checkpoints (``Alpha-VLLM/Lumina-mGPT-7B-*``, saved by
their vendored copy of transformers' Chameleon as ``ChameleonXLLMXForConditionalGeneration``)
has the name transformers' ``ChameleonForConditionalGeneration`` gives it -- except in shape for
the per-head query/key LayerNorms: Lumina's copy stores ``self_attn.q_norm`` / ``k_norm``
weight and bias as ``[model_parallel_size, head_dim]`` and repeats each row over its shard's
heads at run time, transformers stores them repeated, ``[heads, head_dim]`` (``k_norm``: key
heads). The adapter expands Lumina's rows on the way in (``repeat_interleave``, exact) and
writes transformers' layout on the way out, which is what the export's class loads; convert's
round-trip check reads a Lumina-layout tensor back expanded (:meth:`round_trip_tensor`).
A checkpoint already in transformers' layout converts by name alone, bit for bit both ways.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mmcore.engines import Recipe, RenameAdapter, TensorInfo

NORM = re.compile(r".*\.self_attn\.(q|k)_norm\.(weight|bias)$")


@dataclass
class LuminaAdapter(RenameAdapter):
    """Names are transformers'; Lumina's shard-wise q/k norms are repeated per head.

    ``heads`` is (query heads, key heads) of the config; without it (no config read yet) the
    head counts are taken from the projections' shapes in the checkpoint itself."""

    heads: tuple[int, int] | None = None
    _lumina: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def _head_counts(self, hf: dict[str, TensorInfo]) -> tuple[int, int]:
        if self.heads is not None:
            return self.heads
        for key, info in hf.items():
            match = NORM.match(key)
            if match and match.group(1) == "q":
                head_dim = info.shape[-1]
                q = hf[key.replace("q_norm." + match.group(2), "q_proj.weight")].shape[0] // head_dim
                k = hf[key.replace("q_norm." + match.group(2), "k_proj.weight")].shape[0] // head_dim
                return q, k
        return 0, 0

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        plan = super().to_mm(hf)
        q_heads, k_heads = self._head_counts(hf)
        for key, recipe in list(plan.items()):
            match = NORM.match(key)
            if not match:
                continue
            heads = q_heads if match.group(1) == "q" else k_heads
            rows, head_dim = recipe.info.shape
            if rows == heads:
                continue  # transformers' layout
            if heads % rows:
                from mmcore.errors import StageError

                raise StageError(f"{key}: {rows} rows of q/k norm for {heads} heads; Lumina's layout has one row per model-parallel shard, dividing the heads")
            self._lumina[recipe.sources[0]] = heads // rows
            plan[key] = Recipe(recipe.sources, TensorInfo((heads, head_dim), recipe.info.dtype), _repeat(heads // rows))
        return plan

    def round_trip_tensor(self, hub_key: str, tensor: Any) -> Any:
        """What ``hub_key`` looks like after conversion in and back out: Lumina's rows repeated per head."""
        repeat = self._lumina.get(hub_key)
        return tensor if repeat is None else tensor.repeat_interleave(repeat, dim=0).contiguous()


def _repeat(times: int) -> Any:
    def combine(tensor: Any) -> Any:
        return tensor.repeat_interleave(times, dim=0).contiguous()

    return combine
