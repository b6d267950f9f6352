"""One declarative table from a Hugging Face checkpoint's tensor names to Megatron's, with how
each tensor is fused and how it is split across tensor-parallel ranks.

A family writes its table once (:class:`ParallelMap`: a :class:`Rule` per tensor, a
:class:`LayerStack` per stack of layers); the same table converts in both directions, splits
and merges tensor-parallel shards and places layers on pipeline stages. No per-model loops::

    Rule("decoder.layers.{n}.self_attention.linear_qkv.weight",
         ("model.layers.{n}.self_attn.q_proj.weight", "model.layers.{n}.self_attn.k_proj.weight",
          "model.layers.{n}.self_attn.v_proj.weight"), "qkv", sizes=(q_rows, head_dim, head_dim))

Kinds (Megatron's parallel layers):

* ``replicated``: every rank holds it whole (norms, a row-parallel layer's bias, a patch embedding).
* ``column``: split along dim 0 (a column-parallel linear's weight and bias, a vocab-parallel
  embedding, the output layer).
* ``row``: split along dim 1 (a row-parallel linear's weight).
* ``qkv``: HF's q, k and v fused per query group, ``[q_g; k_g; v_g]`` for each group ``g`` in
  turn (``sizes``: the rows of q, k and v in one group), then split along dim 0: each rank
  holds whole groups.
* ``heads_qkv``: one HF ``qkv`` tensor (q, k, v stacked) regrouped per attention head,
  ``[q_h; k_h; v_h]`` (``sizes``: the heads' rows, three times), then split along dim 0.
* ``gate_up``: HF's gate and up fused as ``[gate; up]``; each rank holds ``[gate_r; up_r]``.

Only torch; nothing here imports megatron-core.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Literal, Mapping, Sequence

from mmcore.errors import StageError

if TYPE_CHECKING:
    import torch

Kind = Literal["replicated", "column", "row", "qkv", "heads_qkv", "gate_up"]
State = dict[str, "torch.Tensor"]


@dataclass(frozen=True)
class Rule:
    """One Megatron tensor and the HF tensor(s) it is made of.

    Attributes:
        megatron: its Megatron name; ``{n}`` stands for a layer's index.
        hf: the HF name(s) it is made of, in fusion order (q, k, v; gate, up); ``{n}`` as above.
        kind: how it is fused and split (the module docstring lists the kinds).
        sizes: ``qkv`` and ``heads_qkv``: the rows of q, k and v in one query group (or head).
        optional: the HF checkpoint may lack it (a tied output layer, a bias some versions have).
        vocab: its rows are the vocabulary (embedding, output layer): padded with zero rows to
            a size the tensor-parallel ranks divide, the padding stripped on the way back.
    """

    megatron: str
    hf: tuple[str, ...]
    kind: Kind = "replicated"
    sizes: tuple[int, int, int] = (0, 0, 0)
    optional: bool = False
    vocab: bool = False

    def __post_init__(self) -> None:
        parts = {"qkv": 3, "heads_qkv": 1, "gate_up": 2}.get(self.kind, 1)
        if len(self.hf) != parts:
            raise ValueError(f"rule {self.megatron}: kind {self.kind} is made of {parts} HF tensor(s), not {len(self.hf)}")
        if self.kind in ("qkv", "heads_qkv") and not all(self.sizes):
            raise ValueError(f"rule {self.megatron}: kind {self.kind} needs sizes (q, k, v rows per group)")

    def fuse(self, parts: Sequence["torch.Tensor"]) -> "torch.Tensor":
        import torch

        if self.kind == "qkv":
            groups = parts[0].shape[0] // self.sizes[0]
            return torch.cat([p.reshape(groups, -1, *p.shape[1:]) for p in parts], dim=1).reshape(-1, *parts[0].shape[1:])
        if self.kind == "heads_qkv":
            (qkv,) = parts
            heads = qkv.shape[0] // sum(self.sizes)
            return qkv.reshape(3, heads, -1, *qkv.shape[1:]).transpose(0, 1).reshape(qkv.shape)
        if self.kind == "gate_up":
            return torch.cat(list(parts))
        return parts[0]

    def unfuse(self, fused: "torch.Tensor") -> list["torch.Tensor"]:
        if self.kind == "qkv":
            grouped = fused.reshape(-1, sum(self.sizes), *fused.shape[1:])
            return [p.reshape(-1, *fused.shape[1:]).contiguous() for p in grouped.split(list(self.sizes), dim=1)]
        if self.kind == "heads_qkv":
            heads = fused.shape[0] // sum(self.sizes)
            return [fused.reshape(heads, 3, -1, *fused.shape[1:]).transpose(0, 1).reshape(fused.shape).contiguous()]
        if self.kind == "gate_up":
            return [p.contiguous() for p in fused.chunk(2)]
        return [fused]

    def split(self, fused: "torch.Tensor", tp: int) -> list["torch.Tensor"]:
        """The ``tp`` ranks' shards of the fused tensor."""
        import torch

        if self.kind == "replicated" or tp == 1:
            return [fused] * tp
        dim = 1 if self.kind == "row" else 0
        if self.vocab and fused.shape[0] % tp:  # Megatron's vocabulary padding: zero rows no token uses
            fused = torch.cat([fused, fused.new_zeros(tp - fused.shape[0] % tp, *fused.shape[1:])])
        if self.kind in ("qkv", "heads_qkv"):
            groups = fused.shape[0] // sum(self.sizes)
            if groups % tp:
                raise StageError(f"{self.megatron}: {groups} query groups (heads) do not split over tensor_parallel={tp}")
        elif fused.shape[dim] % (2 * tp if self.kind == "gate_up" else tp):
            raise StageError(f"{self.megatron}: dim {dim} of size {fused.shape[dim]} does not split over tensor_parallel={tp}")
        if self.kind == "gate_up":
            gate, up = fused.chunk(2)
            return [torch.cat([g, u]).contiguous() for g, u in zip(gate.chunk(tp), up.chunk(tp))]
        return [p.contiguous() for p in fused.chunk(tp, dim=dim)]

    def shard(self, parts: Sequence["torch.Tensor"], tp: int, rank: int) -> "torch.Tensor":
        """Rank ``rank``'s shard, ``split(fuse(parts), tp)[rank]``, made from that rank's slices
        of ``parts`` only: of tensors mapped from a file, only the pages of the rank's slices are
        read, and no whole fused (or padded) tensor is built."""
        import torch

        if self.kind == "replicated" or tp == 1:
            return self.fuse(parts)
        if self.kind == "row":
            (part,) = parts
            if part.shape[1] % tp:
                raise StageError(f"{self.megatron}: dim 1 of size {part.shape[1]} does not split over tensor_parallel={tp}")
            width = part.shape[1] // tp
            return part.narrow(1, rank * width, width)
        if self.kind == "column":
            (part,) = parts
            rows = part.shape[0]
            if not self.vocab and rows % tp:
                raise StageError(f"{self.megatron}: dim 0 of size {rows} does not split over tensor_parallel={tp}")
            height = -(-rows // tp)  # Megatron's vocabulary padding: zero rows no token uses
            start = min(rank * height, rows)
            piece = part.narrow(0, start, min(height, rows - start))
            return piece if piece.shape[0] == height else torch.cat([piece, piece.new_zeros(height - piece.shape[0], *piece.shape[1:])])
        if self.kind == "gate_up":
            if parts[0].shape[0] % tp:
                raise StageError(f"{self.megatron}: dim 0 of size {2 * parts[0].shape[0]} does not split over tensor_parallel={tp}")
            height = parts[0].shape[0] // tp
            return torch.cat([p.narrow(0, rank * height, height) for p in parts])
        if self.kind == "qkv":
            groups = parts[0].shape[0] // self.sizes[0]
            if groups % tp:
                raise StageError(f"{self.megatron}: {groups} query groups (heads) do not split over tensor_parallel={tp}")
            mine = groups // tp
            return self.fuse([p.narrow(0, rank * mine * rows, mine * rows) for p, rows in zip(parts, self.sizes)])
        (qkv,) = parts  # heads_qkv: [q; k; v], each block the heads' rows in turn
        heads = qkv.shape[0] // sum(self.sizes)
        if heads % tp:
            raise StageError(f"{self.megatron}: {heads} query groups (heads) do not split over tensor_parallel={tp}")
        mine, starts = heads // tp, [heads * sum(self.sizes[:i]) for i in range(3)]
        return self.fuse([torch.cat([qkv.narrow(0, start + rank * mine * rows, mine * rows) for start, rows in zip(starts, self.sizes)])])

    def pieces(self, shard: "torch.Tensor", tp: int, rank: int, vocab_size: int = 0) -> list[tuple[int, tuple[int, ...], "torch.Tensor"]]:
        """Where rank ``rank``'s ``shard`` lies in the HF tensors (the inverse of :meth:`shard`):
        ``(which of hf, offsets in that tensor, the piece)`` for each piece; a ``replicated``
        tensor is rank 0's alone, and a vocabulary's padding rows (beyond ``vocab_size``) are
        left out. The pieces of all ranks tile each HF tensor exactly, so the ranks can write
        a whole model together without any of them holding it."""
        zero = (0,) * shard.dim()

        def at(dim: int, offset: int) -> tuple[int, ...]:
            return tuple(offset if d == dim else 0 for d in range(shard.dim()))

        if self.kind == "replicated" or tp == 1:
            if rank:
                return []
            if self.vocab and vocab_size and shard.shape[0] > vocab_size:
                shard = shard[:vocab_size]
            return [(i, zero, part) for i, part in enumerate(self.unfuse(shard))]
        if self.kind == "row":
            return [(0, at(1, rank * shard.shape[1]), shard)]
        if self.kind == "column":
            start = rank * shard.shape[0]
            if self.vocab and vocab_size:
                shard = shard[: max(0, vocab_size - start)]
            return [(0, at(0, start), shard)] if shard.shape[0] else []
        if self.kind in ("gate_up", "qkv"):
            return [(i, at(0, rank * part.shape[0]), part) for i, part in enumerate(self.unfuse(shard))]
        (local,) = self.unfuse(shard)  # heads_qkv: this rank's heads of q, of k, of v, in one tensor
        mine = shard.shape[0] // sum(self.sizes)
        out, offset = [], 0
        for i, rows in enumerate(self.sizes):
            start = mine * tp * sum(self.sizes[:i])
            out.append((0, at(0, start + rank * mine * rows), local.narrow(0, offset, mine * rows)))
            offset += mine * rows
        return out

    def merge(self, shards: Sequence["torch.Tensor"]) -> "torch.Tensor":
        """The fused tensor from its ranks' shards (``replicated``: the first; they must agree)."""
        import torch

        if self.kind == "replicated" or len(shards) == 1:
            if any(not torch.equal(s, shards[0]) for s in shards[1:]):
                raise StageError(f"{self.megatron}: a replicated tensor differs between tensor-parallel ranks")
            return shards[0]
        if self.kind == "gate_up":
            halves = [s.chunk(2) for s in shards]
            return torch.cat([*(h[0] for h in halves), *(h[1] for h in halves)])
        return torch.cat(list(shards), dim=1 if self.kind == "row" else 0)


@dataclass(frozen=True)
class LayerStack:
    """A stack of numbered layers (``{prefix}{n}.``) that pipeline stages divide between them;
    ``first`` / ``last``: name prefixes that live with the stack's first / last layers (the
    embedding; the final norm and output layer)."""

    prefix: str
    first: tuple[str, ...] = ()
    last: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParallelMap:
    """A family's table: its rules, its layer stacks, and whether the output layer is the
    embedding (``tied``: the HF checkpoint has no output layer of its own; Megatron keeps a copy
    on the last pipeline stage when there are several)."""

    rules: tuple[Rule, ...]
    stacks: tuple[LayerStack, ...] = ()
    tied: tuple[str, str] | None = None  # (megatron output layer, megatron embedding)
    vocab_size: int = 0  # the HF vocabulary: rows beyond it (tensor-parallel padding) are stripped on the way back
    _patterns: dict[str, re.Pattern[str]] = field(default_factory=dict, compare=False, repr=False)

    def _pattern(self, name: str) -> re.Pattern[str]:
        if name not in self._patterns:
            self._patterns[name] = re.compile("^" + re.escape(name).replace(r"\{n\}", r"(\d+)") + "$")
        return self._patterns[name]

    def _instances(self, names: Iterable[str], pattern: str) -> list[str | None]:
        """The layer indices (as strings; None for a name without ``{n}``) ``names`` hold of ``pattern``."""
        if "{n}" not in pattern:
            return [None] if pattern in names else []
        found = {m.group(1) for m in map(self._pattern(pattern).match, names) if m}
        return sorted(found, key=int)

    def plan(self, hf_names: Iterable[str]) -> dict[str, tuple[Rule, tuple[str, ...]]]:
        """What :meth:`to_megatron` makes of HF tensors of these names, from the names alone:
        Megatron name -> (its rule, the HF names fused into it). An HF tensor no rule takes, or
        a missing part of a fused one, is an error naming it."""
        names = set(hf_names)
        out: dict[str, tuple[Rule, tuple[str, ...]]] = {}
        used: set[str] = set()
        for rule in self.rules:
            instances = self._instances(names, rule.hf[0])
            for n in instances:
                parts = tuple(h.format(n=n) for h in rule.hf) if n is not None else rule.hf
                missing = [name for name in parts if name not in names]
                if missing:
                    raise StageError(f"checkpoint tensor {missing[0]} is missing (it is fused into {rule.megatron.format(n=n)})")
                out[rule.megatron.format(n=n) if n is not None else rule.megatron] = (rule, parts)
                used.update(parts)
            if not instances and not rule.optional and "{n}" not in rule.hf[0]:
                raise StageError(f"checkpoint tensor {rule.hf[0]} is missing")
        unknown = sorted(names - used)
        if unknown:
            raise StageError(f"checkpoint tensor {unknown[0]} has no Megatron counterpart in the table" + (f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""))
        return out

    def to_megatron(self, hf: Mapping[str, "torch.Tensor"]) -> State:
        """The whole (tensor-parallel size 1) Megatron state of an HF state dict (:meth:`plan`
        says which tensors make which)."""
        return {name: rule.fuse([hf[part] for part in parts]) for name, (rule, parts) in self.plan(hf.keys()).items()}

    def to_hf(self, megatron: Mapping[str, "torch.Tensor"]) -> State:
        """The HF state dict of a whole Megatron state (the inverse of :meth:`to_megatron`); a
        tied model's output layer is dropped (HF ties it to the embedding)."""
        out: State = {}
        used: set[str] = set()
        for rule in self.rules:
            for n in self._instances(megatron.keys(), rule.megatron):
                name = rule.megatron.format(n=n) if n is not None else rule.megatron
                used.add(name)
                if self.tied and name == self.tied[0]:
                    continue
                tensor = megatron[name]
                if rule.vocab and self.vocab_size and tensor.shape[0] > self.vocab_size:
                    tensor = tensor[: self.vocab_size].clone()  # not a view of the padded rows
                for hf_name, part in zip(rule.hf, rule.unfuse(tensor)):
                    out[hf_name.format(n=n) if n is not None else hf_name] = part
        unknown = sorted(set(megatron) - used)
        if unknown:
            raise StageError(f"Megatron tensor {unknown[0]} has no HF counterpart in the table" + (f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""))
        return out

    def layer_of(self, rule: Rule, name: str) -> str | None:
        """The layer index (``{n}``) in ``name``, a tensor of ``rule`` (None: not a layer's)."""
        match = self._pattern(rule.megatron).match(name)
        return match.group(1) if match and "{n}" in rule.megatron else None

    def rule_of(self, name: str) -> Rule:
        for rule in self.rules:
            if self._pattern(rule.megatron).match(name):
                return rule
        raise StageError(f"Megatron tensor {name} has no rule in the table")

    def split_tp(self, megatron: Mapping[str, "torch.Tensor"], tp: int) -> list[State]:
        """The ``tp`` tensor-parallel ranks' states of a whole Megatron state."""
        ranks: list[State] = [{} for _ in range(tp)]
        for name, tensor in megatron.items():
            for rank, shard in zip(ranks, self.rule_of(name).split(tensor, tp)):
                rank[name] = shard
        return ranks

    def merge_tp(self, ranks: Sequence[Mapping[str, "torch.Tensor"]]) -> State:
        """The whole Megatron state of its tensor-parallel ranks' states."""
        names = list(ranks[0])
        for rank, state in enumerate(ranks[1:], start=1):
            if set(state) != set(names):
                odd = sorted(set(state) ^ set(names))[0]
                raise StageError(f"tensor-parallel rank {rank} and rank 0 hold different tensors ({odd})")
        return {name: self.rule_of(name).merge([state[name] for state in ranks]) for name in names}

    # -- pipeline stages ---------------------------------------------------------------------

    def layer_count(self, megatron: Mapping[str, "torch.Tensor"], stack: LayerStack) -> int:
        indices = {name[len(stack.prefix) :].split(".", 1)[0] for name in megatron if name.startswith(stack.prefix)}
        return len(indices)

    def split_pp(self, megatron: Mapping[str, "torch.Tensor"], layers: Mapping[str, Sequence[int]]) -> list[State]:
        """Pipeline stages of a Megatron state (of one tensor-parallel rank): ``layers[prefix]``
        says how many of that stack's layers each stage holds, renumbered from 0 on each stage
        (Megatron's local numbering); the stack's ``first``/``last`` tensors go with its first and
        last layers. A tied output layer gets a copy of the embedding on the last stage when the
        two are on different stages (as Megatron keeps it)."""
        stages = len(next(iter(layers.values())))
        out: list[State] = [{} for _ in range(stages)]
        placed: set[str] = set()
        ends: dict[str, tuple[int, int]] = {}  # stack prefix -> (its first stage, its last)
        for stack in self.stacks:
            counts = list(layers[stack.prefix])
            total = self.layer_count(megatron, stack)
            if len(counts) != stages or sum(counts) != total or min(counts) < 0:
                raise StageError(f"{stack.prefix}*: {total} layers cannot be placed as {counts} on {stages} pipeline stages")
            holding = [i for i, c in enumerate(counts) if c] or [0]
            ends[stack.prefix] = (holding[0], holding[-1])
            starts = [sum(counts[:i]) for i in range(stages)]
            for name, tensor in megatron.items():
                if name.startswith(stack.prefix):
                    index, rest = name[len(stack.prefix) :].split(".", 1)
                    stage = next(i for i in range(stages) if starts[i] <= int(index) < starts[i] + counts[i])
                    out[stage][f"{stack.prefix}{int(index) - starts[stage]}.{rest}"] = tensor
                elif name.startswith(stack.first):
                    out[holding[0]][name] = tensor
                elif name.startswith(stack.last):
                    out[holding[-1]][name] = tensor
                else:
                    continue
                placed.add(name)
        left = sorted(set(megatron) - placed)
        if left:
            raise StageError(f"Megatron tensor {left[0]} belongs to no layer stack of the table")
        if self.tied and self.tied[0] not in megatron:
            output, embedding = self.tied
            last = ends[next(s.prefix for s in self.stacks if output.startswith(s.last))][1]
            first = ends[next(s.prefix for s in self.stacks if embedding.startswith(s.first))][0]
            if last != first:
                out[last][output] = megatron[embedding]
        return out

    def merge_pp(self, stages: Sequence[Mapping[str, "torch.Tensor"]]) -> State:
        """The Megatron state of its pipeline stages' states (layers renumbered globally, each
        stage's count read from its own tensors); a tied output layer's copy dropped."""
        out: State = {}
        offsets = {stack.prefix: 0 for stack in self.stacks}
        for stage in stages:
            for name, tensor in stage.items():
                stack = next((s for s in self.stacks if name.startswith(s.prefix)), None)
                if stack is not None:
                    index, rest = name[len(stack.prefix) :].split(".", 1)
                    name = f"{stack.prefix}{offsets[stack.prefix] + int(index)}.{rest}"
                elif self.tied and name == self.tied[0] and len(stages) > 1:
                    continue
                if name in out:
                    raise StageError(f"Megatron tensor {name} is on two pipeline stages")
                out[name] = tensor
            for stack in self.stacks:
                offsets[stack.prefix] += self.layer_count(stage, stack)
        return out


def even_layers(total: int, stages: int) -> list[int]:
    """``total`` layers over ``stages`` as evenly as they go, the later stages taking the
    remainder (the first stage also holds the embedding and, in a VLM, the vision tower)."""
    base, extra = divmod(total, stages)
    return [base + (1 if i >= stages - extra else 0) for i in range(stages)]


__all__ = ["Rule", "LayerStack", "ParallelMap", "even_layers", "Kind"]
