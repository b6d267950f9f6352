"""Under ``parallel.ulysses`` a sequence group's ranks split the vision tower's frames
(:mod:`mmcore.backends.ulysses_towers`) instead of each running all of them. That rests on one
property of the Qwen-style towers -- each temporal patch is attended alone, so a clip of ``t``
patches equals ``t`` one-frame pictures -- checked here for every tower class a pack declares it
for, and on the split itself: two processes give every rank the whole output and, summed over the
group, the whole tower's gradients. (The qwen2vl pack's Ulysses run checks the losses end to end.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mmcore.backends.ulysses_towers import frames_of, split_frames

PATCH = 3 * 2 * 2 * 2  # channels x temporal patch x patch x patch: one patch row's width


def tower(kind: str) -> torch.nn.Module:
    """A tiny random tower of ``kind`` (transformers' own class), patch 2, spatial merge 2."""
    import transformers as T

    torch.manual_seed(0)
    common = {"depth": 2, "num_heads": 2, "patch_size": 2, "spatial_merge_size": 2, "temporal_patch_size": 2}
    sized = {"hidden_size": 32, "out_hidden_size": 48, "intermediate_size": 64}
    config, cls = {
        "qwen2-vl": (lambda: T.Qwen2VLVisionConfig(embed_dim=32, hidden_size=48, **common), "qwen2_vl.modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel"),
        "qwen2.5-vl": (lambda: T.Qwen2_5_VLVisionConfig(window_size=8, fullatt_block_indexes=[1], **sized, **common), "qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel"),
        "qwen3-vl": (lambda: T.Qwen3VLVisionConfig(num_position_embeddings=16, deepstack_visual_indexes=[0], **sized, **common), "qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionModel"),
        "glm4v": (lambda: T.Glm4vVisionConfig(image_size=16, **sized, **common), "glm4v.modeling_glm4v.Glm4vVisionModel"),
    }[kind]
    module, name = cls.rsplit(".", 1)
    built = config()
    built._attn_implementation = "sdpa"
    return getattr(__import__(f"transformers.models.{module}", fromlist=[name]), name)(built).eval()


def clip_grid(kind: str) -> torch.Tensor:
    """A picture, a clip of 3 temporal patches and a small picture (GLM-4V's model hands its tower
    a clip frame by frame already)."""
    if kind == "glm4v":
        return torch.tensor([[1, 4, 6], [1, 4, 4], [1, 4, 4], [1, 4, 4], [1, 2, 2]])
    return torch.tensor([[1, 4, 6], [3, 4, 4], [1, 2, 2]])


def test_split_frames_cuts_contiguous_runs_of_about_equal_rows() -> None:
    assert frames_of(torch.tensor([[1, 4, 6], [3, 4, 4]])) == [(4, 6), (4, 4), (4, 4), (4, 4)]
    assert split_frames([24, 16, 16, 16, 4], 2) == [(0, 2), (2, 5)]  # 40 rows / 36
    assert split_frames([16] * 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert split_frames([16], 2) == [(0, 0), (0, 1)]  # fewer frames than ranks: a rank without (its middle row is past half)
    assert split_frames([100, 1, 1], 3) == [(0, 0), (0, 1), (1, 3)]  # a frame is not cut: the runs stay contiguous


@pytest.mark.parametrize("kind", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl", "glm4v"])
def test_a_clip_through_the_tower_equals_its_frames_as_pictures(kind: str) -> None:
    """The property the split rests on, for each tower class of the packs that declare
    ``frame_towers``: runs of frames through the tower one call each, joined, equal the whole
    call (fp32; the same arithmetic on other matrix shapes: measured <= 6e-8)."""
    net, grid = tower(kind), clip_grid(kind)
    x = torch.randn(int(grid.prod(-1).sum()), PATCH, generator=torch.Generator().manual_seed(1))
    whole = net(x, grid_thw=grid)
    frames = frames_of(grid)
    rows = [h * w for h, w in frames]
    parts, start = [], 0
    for first, end in split_frames(rows, 3):
        n = sum(rows[first:end])
        parts.append(net(x[start : start + n], grid_thw=torch.tensor([[1, h, w] for h, w in frames[first:end]])))
        start += n
    torch.testing.assert_close(torch.cat([p.pooler_output for p in parts]), whole.pooler_output, rtol=1e-5, atol=1e-6)
    for i, deep in enumerate(getattr(whole, "deepstack_features", None) or []):
        torch.testing.assert_close(torch.cat([p.deepstack_features[i] for p in parts]), deep, rtol=1e-5, atol=1e-6)


def _split_rank(rank: int, init: str, kind: str, grids: list[list[list[int]]]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        for grid in grids:
            _split_matches_whole(rank, kind, torch.tensor(grid))
    finally:
        dist.destroy_process_group()


def _split_matches_whole(rank: int, kind: str, grid: torch.Tensor) -> None:
    import torch.distributed as dist

    from mmcore.backends.ulysses import SequenceGroup, sharded
    from mmcore.backends.ulysses_towers import split_tower_frames

    x = torch.randn(int(grid.prod(-1).sum()), PATCH, generator=torch.Generator().manual_seed(1))
    reference, split = tower(kind), tower(kind)
    whole = reference(x, grid_thw=grid).pooler_output
    weights = torch.randn(whole.shape, generator=torch.Generator().manual_seed(2))
    (whole * weights).sum().backward()
    split_tower_frames(split, 2)
    with sharded(SequenceGroup(2, rank, dist.group.WORLD)):
        out = split(x, grid_thw=grid).pooler_output
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-6)
    half = out.shape[0] // 2  # each rank's loss reads its half of the rows, as each decoder slice does
    mine = slice(0, half) if rank == 0 else slice(half, None)
    (out[mine] * weights[mine]).sum().backward()
    for (name, p), q in zip(split.named_parameters(), reference.parameters()):
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(grad)
        torch.testing.assert_close(grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_two_ranks_split_the_frames_to_the_whole_output_and_gradients(tmp_path: Path) -> None:
    """A picture, a clip and a small picture, then a single frame: each rank runs its frames
    (with one frame for two ranks, the spare rank the first frame counted zero times), the all-gather gives both the whole output, and the gradients
    summed over the group equal the whole tower's (fp32: rtol 1e-4 for sums in another order)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_split_rank, args=(f"file://{tmp_path}/rendezvous", "qwen2-vl", [[[1, 4, 6], [3, 4, 4], [1, 2, 2]], [[1, 4, 4]]]), nprocs=2, start_method="spawn")
