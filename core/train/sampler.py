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
    _length: int | None = None

    def steps(self, epoch: int) -> list[list[list[int]]]:
        raise NotImplementedError

    def _plan(self, epoch: int) -> list[list[list[int]]]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            self._epoch_cache = (epoch, self.steps(epoch))
        return self._epoch_cache[1]

    def epoch_length(self) -> int:
        """Global micro-batches per epoch: :meth:`next_batch` moves to the next epoch after this many."""
        if self._length is None:  # kept apart from the plan cache: from epoch 1 on, asking epoch 0 each step re-planned both
            self._length = len(self._plan(0))
        return self._length

    def next_batch(self) -> tuple[list[int], int]:
        """This rank's sample indices of the next micro-batch, and its epoch."""
        epoch, index = divmod(self.position, self.epoch_length())
        self.position += 1
        return self._plan(epoch)[index][self.rank], epoch

    def peek_batch(self, ahead: int = 0) -> list[int]:
        """This rank's sample indices of the micro-batch ``ahead`` after the next, without moving."""
        epoch, index = divmod(self.position + ahead, self.epoch_length())
        return self._plan(epoch)[index][self.rank]


class EpochSampler(PlannedSampler):
    """Deterministic shuffled micro-batches, sharded across ranks, resumable at any position.

    With ``groups`` (one key per sample) every global micro-batch holds one group's samples;
    each epoch shuffles within groups, cuts them into global micro-batches and shuffles the order
    of those. A group's ragged tail sits out the epoch (the next epoch's shuffle picks another);
    a group smaller than one global micro-batch is filled up with repeats of its samples, so
    every sample trains (``repeated`` counts the repeats per epoch).

    With ``costs`` (one per sample: tokens through the towers, vision patches and audio frames)
    the data-parallel ranks of a step get alike work: each epoch sorts the shuffled samples by
    cost within windows of ``window`` global micro-batches before cutting them, and deals each
    global micro-batch to the ranks largest cost first, each to the rank with the least so far.
    Equal costs change nothing (the sort is stable). The global micro-batches depend on
    ``world x batch`` only, not on how many ranks share them: one process with ``batch x world``
    sees the same ones.
    """

    def __init__(self, size: int, seed: int, rank: int, world: int, batch: int, groups: list[Any] | None = None, costs: list[float] | None = None, window: int = 64) -> None:
        self.seed, self.rank, self.world, self.batch = seed, rank, world, batch
        self.groups = groups if groups is not None else [0] * size
        self.costs = costs if costs is not None and len(set(costs)) > 1 else None
        self.window = window
        self.position = 0
        self.sizes: dict[Any, int] = {}  # group -> its samples
        for key in self.groups:
            self.sizes[key] = self.sizes.get(key, 0) + 1
        span = world * batch
        self.repeated = sum(span - n for n in self.sizes.values() if n < span)
        if size < span:
            raise StageError(f"the dataset has {size} samples, fewer than one global micro-batch ({world} ranks x {batch}): add samples or lower training.micro_batch_size / the number of processes")
        self._plan(0)

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
            if len(members) < span:  # never trained otherwise: repeat its samples up to one global micro-batch
                members = [members[i % len(members)] for i in range(span)]
            if self.costs is not None:
                costs, stride = self.costs, span * self.window
                members = [i for start in range(0, len(members), stride) for i in sorted(members[start : start + stride], key=lambda i: -costs[i])]
            batches += [members[i : i + span] for i in range(0, len(members) - span + 1, span)]
        rng.shuffle(batches)
        return [self.deal(batch) for batch in batches]

    def deal(self, batch: list[int]) -> list[list[int]]:
        """One global micro-batch as ``world`` rank micro-batches of ``batch`` samples each."""
        if self.costs is None or self.world == 1 or len({self.costs[i] for i in batch}) == 1:
            return [batch[r * self.batch : (r + 1) * self.batch] for r in range(self.world)]
        ranks: list[list[int]] = [[] for _ in range(self.world)]
        load = [0.0] * self.world
        for i in sorted(batch, key=lambda i: -self.costs[i]):  # largest first, to the least loaded rank with room
            r = min((r for r in range(self.world) if len(ranks[r]) < self.batch), key=lambda r: load[r])
            ranks[r].append(i)
            load[r] += self.costs[i]
        return ranks

    def left_out(self) -> int:
        """Samples an epoch leaves out: the groups' ragged tails (others each epoch)."""
        span = self.world * self.batch
        return sum(n % span for n in self.sizes.values() if n >= span)


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

    def __init__(self, lengths: list[int], budget: int, seed: int, rank: int, world: int, window: int = 64, costs: list[float] | None = None) -> None:
        self.lengths, self.budget, self.seed, self.rank, self.world = lengths, budget, seed, rank, world
        self.costs = costs if costs is not None and len(set(costs)) > 1 and world > 1 else None
        self.window = window * world
        self.position = 0
        too_long = [n for n in lengths if n > budget]
        if too_long:
            raise StageError(
                f"{len(too_long)} of {len(lengths)} samples are longer than training.max_tokens={budget} "
                f"(longest {max(too_long)} tokens): raise training.max_tokens above the longest sample (data.cutoff_len caps them where the pack has it)"
            )
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
        if self.costs is not None:
            bins = self.alike_towers(bins, random.Random(self.seed * 1_000_003 + epoch + 1))
        return [sorted(bins[start : start + self.world], key=lambda b: -sum(self.lengths[i] for i in b)) for start in range(0, len(bins) - self.world + 1, self.world)]

    def alike_towers(self, bins: list[list[int]], rng: random.Random, window: int = 16) -> list[list[int]]:
        """``bins`` reordered so that the ``world`` bins of a step carry alike tower work
        (``costs``): within windows of ``window`` steps, sorted by tower cost, cut into steps, the
        steps shuffled; a last partial step stays last."""
        assert self.costs is not None
        costs = self.costs
        stride = self.world * window
        out: list[list[int]] = []
        for start in range(0, len(bins), stride):
            ordered = sorted(bins[start : start + stride], key=lambda b: -sum(costs[i] for i in b))
            steps = [ordered[i : i + self.world] for i in range(0, len(ordered), self.world)]
            whole = [step for step in steps if len(step) == self.world]
            rng.shuffle(whole)
            out += [b for step in whole + [step for step in steps if len(step) < self.world] for b in step]
        return out

    def fill(self, epoch: int = 0) -> float:
        """Real tokens / (bins x budget) over the epoch's dealt bins."""
        steps = self._plan(epoch)
        real = sum(self.lengths[i] for group in steps for b in group for i in b)
        return real / max(1, sum(len(group) for group in steps) * self.budget)


def planned_steps(training: Any, sampler: PlannedSampler, say: Any = None) -> int:
    """The run's length in optimizer steps: ``training.steps``, or with ``training.epochs`` that
    many epochs of the sampler's global micro-batches, ``grad_accum_steps`` to a step, rounded
    down (no step runs past the last epoch's end), said in one line through ``say``."""
    if training.epochs is None:
        return training.steps
    per_epoch = sampler.epoch_length()
    steps = training.epochs * per_epoch // training.grad_accum_steps
    if steps < 1:
        raise StageError(
            f"training.epochs={training.epochs}: {training.epochs} epoch(s) of {per_epoch} micro-batch(es) make no step of "
            f"training.grad_accum_steps={training.grad_accum_steps}: raise training.epochs or lower training.grad_accum_steps"
        )
    if say is not None:
        say(f"training.epochs={training.epochs}: {per_epoch} micro-batch(es) an epoch, {training.grad_accum_steps} a step: {steps} steps")
    return steps


def sampler_notes(sampler: Any) -> list[str]:
    """What the sampler does with samples that do not fill whole global micro-batches."""
    notes = []
    if getattr(sampler, "repeated", 0):
        notes.append(
            f"{sampler.repeated} repeat(s) per epoch fill the global micro-batch of the groups smaller than one "
            "(a micro-batch holds one group: one bucket, or one kind of media), so every sample trains"
        )
    left = sampler.left_out() if hasattr(sampler, "left_out") else 0
    if left:
        notes.append(f"each epoch leaves out {left} sample(s), the groups' ragged tails (others each epoch)")
    return notes


def refuse_fewer_than_a_step(config: Any, train_samples: int, what: str = "samples") -> None:
    """Preprocess's early refusal of a training split smaller than one global micro-batch
    (data-parallel processes x ``training.micro_batch_size``) under this config, before extract
    and train spend anything on it; with ``training.max_tokens`` the train stage judges tokens."""
    training, parallel = getattr(config, "training", None), getattr(config, "parallel", None)
    if training is None or parallel is None or getattr(training, "max_tokens", None) is not None:
        return
    processes = parallel.nproc_per_node * parallel.nnodes
    split = parallel.tensor_parallel * parallel.pipeline_parallel if parallel.backend == "megatron" else 1
    replicas = max(1, processes // split)
    if train_samples < replicas * training.micro_batch_size:
        raise StageError(
            f"{train_samples} training {what}, fewer than one global micro-batch ({replicas} data-parallel process(es) x "
            f"training.micro_batch_size={training.micro_batch_size}): add {what}, or lower training.micro_batch_size or the number of processes"
        )


__all__ = ["PlannedSampler", "EpochSampler", "TokenBudgetSampler", "planned_steps", "sampler_notes", "refuse_fewer_than_a_step"]
