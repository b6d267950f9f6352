"""A sequence group's ranks split the vision tower's frames (``parallel.ulysses`` with a
family's ``VLMFamily.frame_towers``).

Under Ulysses every rank of a sequence group holds the same packed row, so without this each
would run the whole tower on every picture and frame of it: the decoder's work is split N ways,
the tower's is repeated N times, and on long video (hundreds of frames) the tower is most of the
step. Qwen-style towers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V) take the patch rows of
several pictures and clips with their ``grid_thw`` and attend only within each temporal patch
(``cu_seqlens`` per frame; windows inside a frame; positions from the frame's height and width),
so a clip of ``t`` temporal patches is ``t`` pictures of ``(1, h, w)`` to them. The group cuts
the frames into N contiguous runs of about equal rows; each rank runs the tower on its run and an
all-gather (differentiable: the backward reduce-scatters, so each rank's tower gets the whole
group's gradient for its frames) gives every rank the whole output again, in order.

A rank left without a frame (fewer frames than ranks) runs the first frame and adds it times
zero: FSDP2 needs every rank through the same sharded modules, forward and backward.
"""

from __future__ import annotations

from typing import Any

from mmcore.backends.ulysses import _ACTIVE, SequenceGroup


def frames_of(grid_thw: Any) -> list[tuple[int, int]]:
    """Each temporal patch of each entry of ``grid_thw`` ([n, 3]) as ``(h, w)``, in row order."""
    return [(int(h), int(w)) for t, h, w in grid_thw.tolist() for _ in range(int(t))]


def split_frames(rows: list[int], size: int) -> list[tuple[int, int]]:
    """``size`` contiguous runs ``[first, end)`` of frames whose ``rows`` are about equal: frame
    ``i`` goes to the run its middle row falls in (so a run may be empty when frames are few)."""
    total, runs, start, done = sum(rows), [], 0, 0
    owner = []
    for r in rows:
        owner.append(min(size - 1, (2 * done + r) * size // (2 * total)) if total else 0)
        done += r
    for rank in range(size):
        end = start + sum(1 for o in owner if o == rank)
        runs.append((start, end))
        start = end
    return runs


def _gather_rows(local: Any, counts: list[int], group: SequenceGroup) -> Any:
    """The group's ``local`` tensors ([counts[rank], ...] each) joined in rank order, with autograd."""
    import torch
    import torch.distributed._functional_collectives as collectives

    # torch 2.13's name; the older one (deprecated there) for the torch releases before it
    all_gather = getattr(collectives, "all_gather_single_autograd", None) or collectives.all_gather_tensor_autograd
    most = max(counts)
    padded = torch.cat([local, local.new_zeros(most - local.shape[0], *local.shape[1:])]) if local.shape[0] < most else local
    gathered = collectives.wait_tensor(all_gather(padded.contiguous(), 0, group.group))
    return torch.cat([gathered[rank * most : rank * most + n] for rank, n in enumerate(counts)])


def split_tower_frames(tower: Any, merge: int) -> None:
    """Inside :func:`mmcore.backends.ulysses.sharded`, ``tower(patch_rows, grid_thw=...)`` runs on
    this rank's frames and returns the group's whole output (``pooler_output``, and each of
    ``deepstack_features``); ``merge`` is the tower's spatial merge (rows per output token = merge²)."""
    whole = tower.forward

    def forward(hidden_states: Any, grid_thw: Any, **kwargs: Any) -> Any:
        group = _ACTIVE.get()
        if group is None or group.size == 1:
            return whole(hidden_states, grid_thw=grid_thw, **kwargs)
        frames = frames_of(grid_thw)
        rows = [h * w for h, w in frames]
        runs = split_frames(rows, group.size)
        first, end = runs[group.rank]
        offsets = [0]
        for r in rows:
            offsets.append(offsets[-1] + r)
        spare = first == end
        if spare:  # no frame here: the first one, counted zero times (every rank runs the sharded blocks)
            first, end = 0, 1
        grid = grid_thw.new_tensor([[1, h, w] for h, w in frames[first:end]])
        out = whole(hidden_states[offsets[first] : offsets[end]], grid_thw=grid, **kwargs)
        counts = [sum(rows[a:b]) // merge**2 for a, b in runs]

        def gather(local: Any) -> Any:
            if spare:
                local = local[:0] + 0 * local.sum()  # [0, D], tied to the tower's graph
            return _gather_rows(local, counts, group)

        out.pooler_output = gather(out.pooler_output)
        if getattr(out, "deepstack_features", None) is not None:
            out.deepstack_features = [gather(part) for part in out.deepstack_features]
        out.last_hidden_state = None  # per patch row, in the tower's own order; no caller of the split uses it
        return out

    tower.forward = forward


__all__ = ["frames_of", "split_frames", "split_tower_frames"]
