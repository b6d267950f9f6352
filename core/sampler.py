"""The training sampler: which samples make each micro-batch, on each rank, resumable anywhere."""

from __future__ import annotations

import random
from typing import Any

from mmcore.errors import StageError


class EpochSampler:
    """Deterministic shuffled micro-batches, sharded across ranks, resumable at any position.

    With ``groups`` (one key per sample) every global micro-batch holds one group's samples;
    each epoch shuffles within groups, cuts them into global micro-batches (dropping each
    group's ragged tail) and shuffles the order of those.
    """

    def __init__(self, size: int, seed: int, rank: int, world: int, batch: int, groups: list[Any] | None = None) -> None:
        self.seed, self.rank, self.world, self.batch = seed, rank, world, batch
        self.groups = groups if groups is not None else [0] * size
        self.position = 0  # global micro-batches consumed since the start
        self._epoch_cache: tuple[int, list[list[int]]] | None = None
        if not self._plan(0):
            biggest = max(self.groups.count(g) for g in set(self.groups)) if size else 0
            raise StageError(f"the dataset has {size} samples (largest group {biggest}), fewer than one global micro-batch ({world} ranks x {batch})")

    def _plan(self, epoch: int) -> list[list[int]]:
        if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
            return self._epoch_cache[1]
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
        self._epoch_cache = (epoch, batches)
        return batches

    def next_batch(self) -> tuple[list[int], int]:
        per_epoch = len(self._plan(0))
        epoch, index = divmod(self.position, per_epoch)
        span = self._plan(epoch)[index]
        self.position += 1
        return span[self.rank * self.batch : (self.rank + 1) * self.batch], epoch


__all__ = ["EpochSampler"]
