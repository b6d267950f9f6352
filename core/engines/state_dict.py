"""State-dict adapters: how checkpoint tensors map between the hub layout and the training model's.

A pack supplies one :class:`StateDictAdapter` (most need only :class:`RenameAdapter`'s regex
rules); the converter engine (:mod:`mmcore.engines.convert`) plans every output tensor through it
from shapes alone, then builds each tensor when it is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from mmcore.errors import StageError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: "torch.dtype"


@dataclass(frozen=True)
class Recipe:
    """How to make one output tensor: from ``sources`` (input keys), combined by ``combine``.

    ``combine`` receives the source tensors in order and returns the output tensor; None
    means the single source is used as is. ``info`` is the output's shape and dtype, needed
    to plan the write before any tensor is read.
    """

    sources: tuple[str, ...]
    info: TensorInfo
    combine: Callable[..., "torch.Tensor"] | None = None


class StateDictAdapter:
    """Maps checkpoint tensors between the Hugging Face layout and the training model's."""

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        raise NotImplementedError

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        raise NotImplementedError


@dataclass
class RenameAdapter(StateDictAdapter):
    """An adapter that only renames, by ordered regex rules (first match wins, both ways).

    ``rules`` are ``(hf_pattern, mm_replacement, mm_pattern, hf_replacement)``. ``ignore`` are
    patterns of hub tensors left out on the way in (parts of a checkpoint another model uses).
    ``tied`` names
    training-model tensors that hub checkpoints do not store because they share another's
    storage (an output projection tied to the embedding); exports leave them out too.
    """

    rules: Sequence[tuple[str, str, str, str]] = field(default_factory=list)
    tied: Sequence[str] = field(default_factory=list)
    ignore: Sequence[str] = field(default_factory=list)  # hub tensors the training model does not have

    def _ignored(self, key: str) -> bool:
        return any(re.match(pattern, key) for pattern in self.ignore)

    def round_trip_name(self, hub_key: str) -> str | None:
        """The name a hub tensor gets after conversion in and back out (None: left out)."""
        return None if self._ignored(hub_key) else self._rename(self._rename(hub_key, True), False)

    def model_name(self, hub_key: str) -> str:
        """The in-memory model's name of a hub tensor (where a PEFT adapter addresses it)."""
        return self._rename(hub_key, True)

    def _rename(self, key: str, forward: bool) -> str:
        for hf_pat, mm_rep, mm_pat, hf_rep in self.rules:
            pattern, replacement = (hf_pat, mm_rep) if forward else (mm_pat, hf_rep)
            if re.match(pattern, key):
                return re.sub(pattern, replacement, key, count=1)
        return key

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        return _renamed({k: v for k, v in hf.items() if not self._ignored(k)}, lambda k: self._rename(k, True))

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        return _renamed({k: v for k, v in mm.items() if k not in self.tied}, lambda k: self._rename(k, False))


@dataclass
class FusedExpertsAdapter(RenameAdapter):
    """A :class:`RenameAdapter` for MoE models whose experts are fused 3-D tensors
    (``mlp.experts.gate_up_proj`` / ``down_proj``) in either of the two layouts hubs hold.

    transformers 5 keeps them as ``[experts, out, in]`` (nn.Linear's order) and saves them so;
    checkpoints written before it (the released Qwen3-VL-MoE ones) store ``[experts, in, out]``,
    and ``from_pretrained`` transposes those where the shape is not the model's. So does this
    adapter, telling the layouts apart by where the hidden size (``hidden_of``'s last dimension,
    the embedding) sits; exports are written in transformers 5's layout, and
    :meth:`round_trip_tensor` tells ``convert.verify`` which tensors come back transposed. Where
    ``2 x moe_intermediate_size`` equals the hidden size the layouts cannot be told apart from
    shapes (nor can transformers): the tensor is read as transformers 5's.

    ``per_expert``: the family's hub checkpoints store one tensor per expert
    (``mlp.experts.<e>.gate_proj|up_proj|down_proj.weight``: GLM-4.5V, Qwen3-Omni), which the
    model fuses on load; they are stacked on the way in and split again on the way out, so
    exports have the layout the family's own ``save_pretrained`` writes.
    """

    gate_up: str = r"\.mlp\.experts\.gate_up_proj$"
    down: str = r"\.mlp\.experts\.down_proj$"
    hidden_of: str = r"embed_tokens\.weight$"
    per_expert: bool = False
    _legacy: set[str] = field(default_factory=set, init=False, repr=False)

    def _is_legacy(self, key: str, shape: tuple[int, ...], hidden: int | None) -> bool:
        if hidden is None or len(shape) != 3:
            return False
        if re.search(self.gate_up, key):
            return shape[-1] != hidden  # transformers 5: [experts, 2 x intermediate, hidden]
        if re.search(self.down, key):
            return shape[-2] != hidden  # transformers 5: [experts, hidden, intermediate]
        return False

    def to_mm(self, hf: dict[str, TensorInfo]) -> dict[str, Recipe]:
        hidden = next((info.shape[-1] for key, info in hf.items() if re.search(self.hidden_of, key)), None)
        plan = _stacked_experts(super().to_mm(hf))
        out = {}
        for key, recipe in plan.items():
            source = recipe.sources[0]
            if self._is_legacy(source, hf[source].shape, hidden):
                self._legacy.add(source)
                shape = recipe.info.shape
                recipe = Recipe(recipe.sources, TensorInfo((shape[0], shape[2], shape[1]), recipe.info.dtype), _swap_last_two)
            out[key] = recipe
        return out

    def to_hf(self, mm: dict[str, TensorInfo]) -> dict[str, Recipe]:
        plan = super().to_hf(mm)
        return _split_experts(plan) if self.per_expert else plan

    def round_trip_tensor(self, hub_key: str, tensor: "torch.Tensor") -> "torch.Tensor":
        """What the hub tensor ``hub_key`` looks like after conversion in and back out."""
        return _swap_last_two(tensor) if hub_key in self._legacy else tensor


def _swap_last_two(tensor: "torch.Tensor") -> "torch.Tensor":
    return tensor.transpose(-1, -2).contiguous()


PER_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def _stacked_experts(plan: dict[str, Recipe]) -> dict[str, Recipe]:
    """Per-expert tensors (renamed already) -> ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I]."""
    import torch

    experts: dict[str, dict[int, dict[str, Recipe]]] = {}
    out = {}
    for key, recipe in plan.items():
        match = PER_EXPERT.match(key)
        if match is None:
            out[key] = recipe
        else:
            experts.setdefault(match["prefix"], {}).setdefault(int(match["expert"]), {})[match["proj"]] = recipe
    for prefix, by_expert in experts.items():
        count = len(by_expert)
        if sorted(by_expert) != list(range(count)) or any(len(p) != 3 for p in by_expert.values()):
            raise StageError(f"{prefix}: the per-expert tensors are incomplete (experts {sorted(by_expert)}, each needs gate_proj, up_proj and down_proj)")
        gate, down = by_expert[0]["gate_proj"].info, by_expert[0]["down_proj"].info
        pairs = tuple(src for e in range(count) for src in (*by_expert[e]["gate_proj"].sources, *by_expert[e]["up_proj"].sources))
        out[f"{prefix}.gate_up_proj"] = Recipe(pairs, TensorInfo((count, 2 * gate.shape[0], gate.shape[1]), gate.dtype), lambda *t: torch.stack([torch.cat(t[i : i + 2]) for i in range(0, len(t), 2)]))
        downs = tuple(src for e in range(count) for src in by_expert[e]["down_proj"].sources)
        out[f"{prefix}.down_proj"] = Recipe(downs, TensorInfo((count, *down.shape), down.dtype), lambda *t: torch.stack(t))
    return out


def _split_experts(plan: dict[str, Recipe]) -> dict[str, Recipe]:
    """``gate_up_proj`` / ``down_proj`` -> one tensor per expert and projection (the inverse)."""
    out = {}
    for key, recipe in plan.items():
        fused = re.match(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", key)
        if fused is None or len(recipe.info.shape) != 3:
            out[key] = recipe
            continue
        count, rows, cols = recipe.info.shape
        for e in range(count):
            if fused[2] == "down_proj":
                out[f"{fused[1]}.{e}.down_proj.weight"] = Recipe(recipe.sources, TensorInfo((rows, cols), recipe.info.dtype), lambda t, e=e: t[e].contiguous())
            else:
                half = rows // 2
                out[f"{fused[1]}.{e}.gate_proj.weight"] = Recipe(recipe.sources, TensorInfo((half, cols), recipe.info.dtype), lambda t, e=e: t[e, :half].contiguous())
                out[f"{fused[1]}.{e}.up_proj.weight"] = Recipe(recipe.sources, TensorInfo((half, cols), recipe.info.dtype), lambda t, e=e: t[e, half:].contiguous())
    return out


def _renamed(index: dict[str, TensorInfo], rename: Callable[[str], str]) -> dict[str, Recipe]:
    out: dict[str, Recipe] = {}
    for key, info in index.items():
        new = rename(key)
        if new in out:
            raise StageError(f"adapter maps two tensors to {new!r} (one of them {key!r})")
        out[new] = Recipe((key,), info)
    return out


def materialize(recipe: Recipe, fetch: Callable[[str], "torch.Tensor"]) -> "torch.Tensor":
    tensors = [fetch(key) for key in recipe.sources]
    out = recipe.combine(*tensors) if recipe.combine else tensors[0]
    if tuple(out.shape) != recipe.info.shape or out.dtype != recipe.info.dtype:
        raise StageError(f"adapter produced {tuple(out.shape)} {out.dtype} for {recipe.sources}, planned {recipe.info.shape} {recipe.info.dtype}")
    return out


__all__ = ["TensorInfo", "Recipe", "StateDictAdapter", "RenameAdapter", "FusedExpertsAdapter", "materialize"]
