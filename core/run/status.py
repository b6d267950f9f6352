"""How far an unfinished stage got, for ``mmcore status``: the last step it logged
(``metrics.jsonl``) and the newest complete checkpoint (what a resume continues from).
Imports no torch: status must answer in a blink."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mmcore.checkpoint.training import CHECKPOINTS, _step_of, newest_complete
from mmcore.run.lock import RUN_LOCK, holders

#: metrics.jsonl grows a line per step; its last step is in its last lines, read from the end
TAIL_BYTES = 64 * 1024


def last_logged_step(path: Path) -> int | None:
    """The highest ``step`` in the last lines of a ``metrics.jsonl`` (None: no file, no step)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    steps = []
    for line in tail.splitlines():
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # the first line of the tail is cut, and a kill may cut the last
        if isinstance(step, int):
            steps.append(step)
    return max(steps) if steps else None


def unfinished(run_root: Path, stage_dir: Path) -> str | None:
    """``interrupted at step N (checkpoint M)`` (``running ...`` while a process holds the run
    directory's lock) for a stage that logged steps or saved a checkpoint; None otherwise. N is
    the last step in ``metrics.jsonl``: the train loop writes its rows at most a second apart and
    before each checkpoint (:mod:`mmcore.train.metric_log`), so a killed run may have done up to
    a second of steps more, never fewer than its checkpoint."""
    step = last_logged_step(stage_dir / "metrics.jsonl")
    newest = newest_complete(stage_dir / CHECKPOINTS)
    saved = _step_of(newest) if newest is not None else None
    if step is None and saved is None:
        return None
    step = max(step or 0, saved or 0)
    # no complete checkpoint: the engine's run starts again at step 0 (training.checkpoint_every: 0
    # saves only at the end); a pack training its own way may keep its state elsewhere, hence the folder
    where = f" (checkpoint {saved})" if saved is not None else f" (no complete checkpoint in {CHECKPOINTS}/)"
    others = [pid for pid in holders(run_root / RUN_LOCK) if pid != os.getpid()]  # a run asking about itself
    return f"{'running' if others else 'interrupted'} at step {step}{where}"


__all__ = ["last_logged_step", "unfinished"]
