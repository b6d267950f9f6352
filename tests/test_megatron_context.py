"""Context parallelism's attention (:mod:`mmcore.backends.megatron.context`): two processes,
each holding its two chunks of the sequence (Megatron's load-balanced split), gathering the
keys and values and attending causally by global position, give the whole sequence's causal
attention at their positions, and the gradients of their queries, keys and values. (The
qwen2vl pack's megatron run checks the losses end to end: test_qwen2vl_megatron_cp.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mmcore.backends.megatron.context import chunk_positions

SEQ, BATCH, HEADS, GROUPS, DIM = 12, 2, 4, 2, 8


def test_each_rank_holds_an_early_and_a_late_chunk() -> None:
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert sorted(torch.cat([chunk_positions(12, 3, r) for r in range(3)]).tolist()) == list(range(12))
    assert chunk_positions(4, 1, 0).tolist() == [0, 1, 2, 3]


def _whole(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(SEQ, BATCH, HEADS, DIM, generator=g, dtype=torch.float64)
    k = torch.randn(SEQ, BATCH, GROUPS, DIM, generator=g, dtype=torch.float64)
    v = torch.randn(SEQ, BATCH, GROUPS, DIM, generator=g, dtype=torch.float64)
    w = torch.randn(SEQ, BATCH, HEADS * DIM, generator=g, dtype=torch.float64)
    return q, k, v, w


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain causal attention over the whole sequence, grouped-query: [S, B, heads x d]."""
    repeat = HEADS // GROUPS
    qh, kh, vh = q.permute(1, 2, 0, 3), k.repeat_interleave(repeat, 2).permute(1, 2, 0, 3), v.repeat_interleave(repeat, 2).permute(1, 2, 0, 3)
    scores = qh @ kh.transpose(-1, -2) * scale
    scores = scores.masked_fill(torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ vh).permute(2, 0, 1, 3).reshape(SEQ, BATCH, -1)


def _rank(rank: int, init: str) -> None:
    import torch.distributed as dist

    from mmcore.backends.megatron.context import context_attention

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        scale = DIM**-0.5
        q, k, v, w = _whole(0)
        whole = [t.clone().requires_grad_(True) for t in (q, k, v)]
        expected = _reference(*whole, scale)
        (expected * w).sum().backward()
        mine = chunk_positions(SEQ, 2, rank)
        local = [t[mine].clone().requires_grad_(True) for t in (q, k, v)]
        out = context_attention(*local, dist.group.WORLD, scale)
        torch.testing.assert_close(out, expected.detach()[mine], rtol=1e-12, atol=1e-12)
        (out * w[mine]).sum().backward()
        for name, ours, theirs in zip("qkv", local, whole):  # each rank's positions: keys' and values' summed over the ranks' queries
            torch.testing.assert_close(ours.grad, theirs.grad[mine], rtol=1e-12, atol=1e-12, msg=name)
        with torch.no_grad():  # evaluation: no autograd function, the same values
            torch.testing.assert_close(context_attention(*(t.detach() for t in local), dist.group.WORLD, scale), out.detach())
    finally:
        dist.destroy_process_group()


def test_two_ranks_chunked_attention_is_the_whole_causal_attention(tmp_path: Path) -> None:
    """float64, grouped-query (4 query heads over 2 key-value heads), 12 tokens in 4 chunks of 3:
    values and the gradients of q, k and v at each rank's positions equal plain causal attention's."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_rank, args=(f"file://{tmp_path}/rendezvous",), nprocs=2, start_method="spawn")
