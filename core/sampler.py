"""The training sampler: which samples make each micro-batch, on each rank, resumable anywhere."""

from __future__ import annotations

import random
from typing import Any

from mmcore.errors import StageError


class PlannedSampler:
    """Micro-batches planned per epoch (global steps, each a list of per-rank index lists),
    resumable at any ``position`` (global micro-batches consumed since the start)."""

    rank: int
    position: int = 0
    _epoch_cache: tuple[int, list[list[list[int]]]] | None = None

    def steps(self, epoch: int) -> list[list[list[int]]]:
        raise NotImplementedError

    def _plan(self, epoch: int) -> list[list[list[int]]]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            self._epoch_cache = (epoch, self.steps(epoch))
        return self._epoch_cache[1]

    def next_batch(self) -> tuple[list[int], int]:
        """This rank's sample indices of the next micro-batch, and its epoch."""
        epoch, index = divmod(self.position, len(self._plan(0)))
        self.position += 1
        return self._plan(epoch)[index][self.rank], epoch


class EpochSampler(PlannedSampler):
    """Deterministic shuffled micro-batches, sharded across ranks, resumable at any position.

    With ``groups`` (one key per sample) every global micro-batch holds one group's samples;
    each epoch shuffles within groups, cuts them into global micro-batches (dropping each
    group's ragged tail) and shuffles the order of those.
    """

    def __init__(self, size: int, seed: int, rank: int, world: int, batch: int, groups: list[Any] | None = None) -> None:
        self.seed, self.rank, self.world, self.batch = seed, rank, world, batch
        self.groups = groups if groups is not None else [0] * size
        self.position = 0
        if not self._plan(0):
            biggest = max(self.groups.count(g) for g in set(self.groups)) if size else 0
            raise StageError(f"the dataset has {size} samples (largest group {biggest}), fewer than one global micro-batch ({world} ranks x {batch})")

    def steps(self, epoch: int) -> list[list[list[int]]]:
        rng = random.Random(self.seed * 1_000_003 + epoch)
        by_group: dict[Any, list[int]] = {}
        for index, key in enumerate(self.groups):
            by_group.setdefault(key, []).append(index)
        span = self.world * self.batch
        batches = []
        for key in sorted(by_group, key=str):
            members = by_group[key]
            rng.shuffle(members)
            batches += [members[i : i + span] for i in range(0, len(members) - span + 1, span)]
        rng.shuffle(batches)
        return [[batch[r * self.batch : (r + 1) * self.batch] for r in range(self.world)] for batch in batches]


class TokenBudgetSampler(PlannedSampler):
    """Micro-batches filled to a token budget (``training.max_tokens``), for packed rows.

    Each epoch shuffles the samples with the seed, then packs them window by window (``window``
    samples per rank at a time) best-fit decreasing into bins of at most ``budget`` tokens, and
    deals the bins to the ranks in order, one global micro-batch being ``world`` bins of
    comparable fill. Bins that do not make a whole global micro-batch at the end of an epoch
    are left out of it (as :class:`EpochSampler` drops a ragged tail; the next epoch
    reshuffles). The same seed, lengths and budget give the same bins on every machine; ``position`` (global
    micro-batches consumed) is all that a checkpoint needs to resume.
    """

    FULL = 0.98  # a bin filled this far is closed

    def __init__(self, lengths: list[int], budget: int, seed: int, rank: int, world: int, window: int = 64) -> None:
        self.lengths, self.budget, self.seed, self.rank, self.world = lengths, budget, seed, rank, world
        self.window = window * world
        self.position = 0
        too_long = [n for n in lengths if n > budget]
        if too_long:
            raise StageError(f"{len(too_long)} of {len(lengths)} samples are longer than training.max_tokens={budget} "
                             f"(longest {max(too_long)} tokens): raise training.max_tokens above the longest sample (data.cutoff_len caps them where the pack has it)")
        if not self._plan(0):
            raise StageError(f"the dataset's {sum(lengths)} tokens fill fewer than one global micro-batch ({world} ranks x {budget} tokens)")

    def bins(self, epoch: int) -> list[list[int]]:
        """The epoch's bins (sample indices), in the order they are dealt.

        Best-fit decreasing, window by window; a bin less than ``FULL`` filled stays open for
        the next window's samples, so small samples late in the epoch top up earlier bins.
        """
        rng = random.Random(self.seed * 1_000_003 + epoch)
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        done: list[list[int]] = []
        packed: list[list[int]] = []
        free: list[int] = []
        for start in range(0, len(order), self.window):
            for i in sorted(order[start : start + self.window], key=lambda i: -self.lengths[i]):
                need = self.lengths[i]
                fits = [b for b, room in enumerate(free) if room >= need]
                if fits:
                    best = min(fits, key=lambda b: free[b])
                    packed[best].append(i)
                    free[best] -= need
                else:
                    packed.append([i])
                    free.append(self.budget - need)
            full = [b for b, room in enumerate(free) if room <= (1 - self.FULL) * self.budget]
            done += [packed[b] for b in full]
            packed = [p for b, p in enumerate(packed) if b not in full]
            free = [room for b, room in enumerate(free) if b not in full]
        # the epoch's last, emptier bins in order of fill, so the ranks sharing a step get alike ones
        return done + sorted(packed, key=lambda b: -sum(self.lengths[i] for i in b))

    def steps(self, epoch: int) -> list[list[list[int]]]:
        bins = self.bins(epoch)
        return [sorted(bins[start : start + self.world], key=lambda b: -sum(self.lengths[i] for i in b))
                for start in range(0, len(bins) - self.world + 1, self.world)]

    def fill(self, epoch: int = 0) -> float:
        """Real tokens / (bins x budget) over the epoch's dealt bins."""
        steps = self._plan(epoch)
        real = sum(self.lengths[i] for group in steps for b in group for i in b)
        return real / max(1, sum(len(group) for group in steps) * self.budget)


__all__ = ["PlannedSampler", "EpochSampler", "TokenBudgetSampler"]
