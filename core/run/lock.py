"""One run at a time in a run directory, for as long as any of its processes lives.

``mmcore`` holds an exclusive lock on ``.lock`` for its life; each distributed worker holds a
shared lock on ``.workers.lock`` for its own. A new ``mmcore`` takes both: while a worker of an
earlier run lives -- its parent killed a moment ago, the kernel's parent-death signal still on its
way (:mod:`mmcore.run.lifeline`) -- the new run waits a little, then refuses naming the processes,
rather than resume a checkpoint that worker is still writing. Locks are the kernel's
(``flock``): they vanish with their holder, however it dies; nothing stale is left to clean up.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from mmcore.errors import UsageError

RUN_LOCK = ".lock"
WORKERS_LOCK = ".workers.lock"

#: How long a new run waits for the workers of a killed one to die (the kernel kills them at
#: once; this covers a loaded machine and a file system that releases locks lazily)
WORKERS_GRACE_S = 15.0


def lock_run(root: Path) -> IO[str]:
    """The run directory's exclusive lock, held by the returned handle; a one-line
    :class:`UsageError` naming the processes when another run has it."""
    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / RUN_LOCK, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owners = holders(root / RUN_LOCK)
        handle.close()
        raise UsageError(
            f"{root} is in use by another mmcore process" + (f" ({_pids(owners)})" if owners else ""), hint="wait for it to finish, or stop it; one run directory takes one run at a time"
        ) from None
    try:
        _await_workers(root)
    except BaseException:
        handle.close()
        raise
    return handle


def hold_as_worker(root: Path) -> IO[str]:
    """A worker's shared lock, held by the returned handle for the worker's life."""
    handle = open(root / WORKERS_LOCK, "a+")
    fcntl.flock(handle, fcntl.LOCK_SH)  # blocks only for the instant a new run checks
    return handle


def _await_workers(root: Path) -> None:
    grace = WORKERS_GRACE_S
    deadline = time.monotonic() + grace
    with open(root / WORKERS_LOCK, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
    owners = holders(root / WORKERS_LOCK)
    raise UsageError(
        f"{root}: worker processes of an earlier run are still alive after {grace:.0f} s" + (f" ({_pids(owners)})" if owners else "") + "; they would write into the checkpoints this run resumes",
        hint="they end when their launcher dies; stop them (kill them by pid) or wait, then run again",
    )


def holders(path: Path) -> list[int]:
    """The pids holding a ``flock`` on ``path`` (Linux's ``/proc/locks``; empty elsewhere)."""
    try:
        stat = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return []
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    pids = []
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("->" marks a waiter: its fields shift)
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != inode:
            continue
        pid = int(fields[4])
        if pid not in pids:
            pids.append(pid)
    return sorted(pids)


def _pids(pids: list[int]) -> str:
    return ("pid " if len(pids) == 1 else "pids ") + ", ".join(map(str, pids))


__all__ = ["RUN_LOCK", "WORKERS_LOCK", "holders", "hold_as_worker", "lock_run"]
