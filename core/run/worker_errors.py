"""The workers' errors, said once by the command that launched them.

Every rank of a distributed stage usually fails the same way (a bad config, a step whose loss is
not finite): printed by each rank, the user read the same line once per process between
torchrun's own. Each worker instead leaves its error in a folder the launcher made
(``MMCORE_WORKER_ERRORS``); the launcher says each distinct error once, naming the ranks that
hit it, and a single one as *the* error line of the command, with the workers' exit code.
A worker started without that folder (by hand) prints its line as before.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mmcore.errors import MmcoreError, StageError

ERRORS_ENV = "MMCORE_WORKER_ERRORS"


class WorkerError(MmcoreError):
    """The error the ranks of a distributed stage reported, with their exit code."""

    def __init__(self, message: str, *, hint: str | None, exit_code: int) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code


def report(rank: int, message: str, hint: str | None, exit_code: int) -> None:
    """A worker's error: into the launcher's folder, or printed where there is none."""
    folder = os.environ.get(ERRORS_ENV)
    if folder and Path(folder).is_dir():
        path = Path(folder) / f"rank-{rank}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"rank": rank, "message": message, "hint": hint, "exit_code": exit_code}), encoding="utf-8")
        temporary.replace(path)
        return
    print(f"error (rank {rank}): {message}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr, flush=True)


def collected(folder: Path, world_size: int, what: str, code: int, hint: str | None) -> MmcoreError:
    """The error of a launch that failed with torchrun's exit ``code``: the workers' one error
    (printing nothing), or each distinct one printed and a summary."""
    reports = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    groups: dict[tuple[str, str | None], list[dict]] = {}
    for entry in sorted(reports, key=lambda e: e["rank"]):
        groups.setdefault((entry["message"], entry.get("hint")), []).append(entry)
    summary = f"{what} failed on {world_size} processes (torchrun exit code {code})"
    if len(groups) == 1:
        (message, worker_hint), entries = next(iter(groups.items()))
        return WorkerError(f"{message} ({_ranks(entries)} of {world_size})", hint=worker_hint, exit_code=int(entries[0]["exit_code"]))
    for (message, worker_hint), entries in groups.items():
        print(f"error ({_ranks(entries)}): {message}" + (f" (hint: {worker_hint})" if worker_hint else ""), file=sys.stderr, flush=True)
    return StageError(summary + ("; see the workers' messages above" if groups else "; no worker said why (one was killed: torchrun's line above names it)"), hint=hint)


def _ranks(entries: list[dict]) -> str:
    ranks = [str(e["rank"]) for e in entries]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)


__all__ = ["ERRORS_ENV", "WorkerError", "collected", "report"]
