"""Held-out evaluation shared by the packs: split the work across ranks, sum the counts, and the
metrics that more than one family reports (word error rate).

Under FSDP every rank must run the same number of forward passes, so the held-out items are dealt
round-robin and ranks with one item fewer repeat one whose result is not counted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["sharded_sums", "word_errors", "char_errors", "normalize_words", "evaluate_files", "files_folder"]


def files_folder(files: Sequence[str]) -> str:
    """``mmcore eval --data``'s results folder: ``evaluate-<file stem>`` (several files: their
    stems joined by ``+``), beside the run's own ``evaluate/``."""
    stems = [re.sub(r"[^A-Za-z0-9._-]+", "-", Path(f).stem).strip("-.") or "data" for f in files]
    return "evaluate-" + "+".join(stems)[:100]


def evaluate_files(runner: Any, files: Sequence[str], request: Any = None, *, force: bool = False) -> Any:
    """Run the evaluate stage on ``files`` (``mmcore eval --data``) into its own folder
    (:func:`files_folder`), with its own manifest: the run's config and its own ``evaluate/``
    results are left as they are (``mmcore status`` still says evaluate is done), and asking
    again for the same files with the same model is up to date. ``request`` (the command's
    :class:`~mmcore.run.session.Request`): its overrides apply to this evaluation only, never
    recorded in the run's ``config.yaml``. Returns the manifest."""
    from mmcore.run.rundir import RunDir
    from mmcore.run.runner import Runner
    from mmcore.run.session import open_session

    config = (open_session(runner.plugins, request).config if request is not None else runner.config).model_copy(deep=True)
    config.evaluate.datasets = [str(Path(f).absolute()) for f in files]
    own = RunDir(runner.run_dir.root, folders={"evaluate": files_folder(files)})
    return Runner(runner.plugins, runner.pack, config, own, debug=runner.debug, world=runner.world).run_stage("evaluate", resume="no", force=force)


def sharded_sums(ctx: Any, count: int, measure: Callable[..., Sequence[float]], width: int, fill: Any = None) -> list[float]:
    """Sum ``measure(i)`` (``width`` numbers) over items ``0..count-1``, the work split across ranks.

    Args:
        ctx: the stage context (its ``world`` says this process's rank and the world size).
        count: how many held-out items there are.
        measure: item index -> ``width`` numbers to add up (e.g. ``[errors, words]``); it runs
            the model, so every rank calls it equally often. With ``fill`` it is called as
            ``measure(i, kinds)``: the media kinds another rank's item of the same round holds
            and item ``i`` lacks, to be collated with their fillers (``fill.collate``).
        width: how many numbers ``measure`` returns.
        fill: the items' :class:`~mmcore.data.fillers.Fill` (indices are item numbers), where
            the model's towers run only on the media a batch holds.

    Returns:
        The sums over all items and ranks, the same on every rank.
    """
    import torch
    import torch.distributed as dist

    world = ctx.world
    mine = list(range(world.rank, count, world.world_size))
    rounds = -(-count // world.world_size) if count else 0
    items = [mine[r] if r < len(mine) else (mine[0] if mine else 0) for r in range(rounds)]
    missing: list[list[str]] = [[] for _ in items]
    if fill is not None and world.distributed and items:
        held = fill.presence([[i] for i in items] if mine else [[] for _ in items])
        device = ctx.accelerator.device(world.local_rank)
        summed = torch.tensor(held, dtype=torch.float32, device=device)
        dist.all_reduce(summed)  # which kinds each round's items hold on any rank, before any forward
        missing = fill.missing(held, summed.cpu().tolist())
    totals = torch.zeros(width, dtype=torch.float64)
    for r in range(rounds):
        counted = r < len(mine)
        values = measure(items[r], missing[r]) if fill is not None else measure(items[r])
        if counted:
            totals += torch.tensor([float(v) for v in values], dtype=torch.float64)
    if world.distributed:
        device = ctx.accelerator.device(world.local_rank)
        on_device = totals.to(device=device, dtype=torch.float32 if device.type == "npu" else torch.float64)
        dist.all_reduce(on_device)
        totals = on_device.cpu().double()
    return totals.tolist()


_PUNCTUATION = re.compile(r"[^\w\s']", re.UNICODE)


def normalize_words(text: str) -> list[str]:
    """Words for WER: case-folded, punctuation other than apostrophes removed."""
    return _PUNCTUATION.sub(" ", text.casefold()).split()


def word_errors(reference: str, hypothesis: str, normalize: Callable[[str], list[str]] = normalize_words) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) after ``normalize``."""
    return edit_distance(normalize(reference), normalize(hypothesis))


def char_errors(reference: str, hypothesis: str, normalize: Callable[[str], list[str]] = normalize_words) -> tuple[int, int]:
    """(character edits, reference characters) of the normalised words joined by single spaces."""
    return edit_distance(list(" ".join(normalize(reference))), list(" ".join(normalize(hypothesis))))


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> tuple[int, int]:
    """(Levenshtein distance, len(ref))."""
    previous = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        current = [i]
        for j, other in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1], len(ref)
