"""The table's per-rank paths: a rank's shard cut from the HF tensors' slices alone
(``Rule.shard``, what loading reads) and the HF pieces a rank's shard makes (``Rule.pieces``,
what each rank writes of a trained model) agree with the whole-tensor split and merge, for
every kind, at several tensor-parallel sizes, with vocabulary padding. Pure torch: the values
are moved, never computed, so equality is exact."""

from __future__ import annotations

import pytest
import torch

from mmcore.errors import StageError
from mmcore.backends.megatron.tensor_map import Rule

VOCAB = 11  # not a multiple of 2 or 4: the last rank's shard has padding rows

RULES = {
    "replicated": (Rule("norm", ("n",)), [(8,)]),
    "column": (Rule("fc1", ("w",), "column"), [(8, 6)]),
    "column vocab": (Rule("embedding", ("e",), "column", vocab=True), [(VOCAB, 6)]),
    "row": (Rule("proj", ("w",), "row"), [(6, 8)]),
    # 4 query groups of 2 q heads (head_dim 3): 6 q rows, 3 k rows, 3 v rows a group
    "qkv": (Rule("qkv", ("q", "k", "v"), "qkv", sizes=(6, 3, 3)), [(24, 5), (12, 5), (12, 5)]),
    "heads_qkv": (Rule("vqkv", ("qkv",), "heads_qkv", sizes=(3, 3, 3)), [(36, 5)]),
    "gate_up": (Rule("fc1", ("gate", "up"), "gate_up"), [(8, 6), (8, 6)]),
}


def _parts(shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator) for shape in shapes]


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("kind", list(RULES))
def test_a_ranks_shard_from_slices_is_its_part_of_the_whole_split(kind: str, tp: int) -> None:
    rule, shapes = RULES[kind]
    parts = _parts(shapes)
    whole_split = rule.split(rule.fuse(parts), tp)
    for rank in range(tp):
        assert torch.equal(rule.shard(parts, tp, rank), whole_split[rank]), (kind, tp, rank)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("kind", list(RULES))
def test_the_ranks_pieces_tile_each_hf_tensor_exactly(kind: str, tp: int) -> None:
    rule, shapes = RULES[kind]
    parts = _parts(shapes)
    rebuilt = [torch.full_like(p, float("nan")) for p in parts]
    covered = [torch.zeros_like(p, dtype=torch.int) for p in parts]
    for rank in range(tp):
        for which, offsets, piece in rule.pieces(rule.shard(parts, tp, rank), tp, rank, VOCAB if rule.vocab else 0):
            window = tuple(slice(o, o + n) for o, n in zip(offsets, piece.shape))
            rebuilt[which][window] = piece
            covered[which][window] += 1
    for part, again, count in zip(parts, rebuilt, covered):
        assert torch.equal(count, torch.ones_like(count)), f"{kind} at TP={tp}: an element written {int(count.min())} to {int(count.max())} times"
        assert torch.equal(again, part), kind


def test_a_split_that_does_not_divide_names_the_tensor() -> None:
    rule, shapes = RULES["qkv"]
    with pytest.raises(StageError, match="qkv: 4 query groups"):
        rule.shard(_parts(shapes), 3, 0)
    with pytest.raises(StageError, match="proj: dim 1 of size 8"):
        RULES["row"][0].shard(_parts([(6, 8)]), 3, 0)
