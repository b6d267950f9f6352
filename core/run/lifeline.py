"""Processes that end with the process that started them.

torchrun starts every worker in a session of its own (``start_new_session``), so a signal to
``mmcore run``'s process group (a terminal's Ctrl-\\, a scheduler's kill, a supervisor's stop)
never reaches them: they went on training and writing checkpoints into a run directory that the
next ``mmcore run`` was already resuming. Each process a run starts (torchrun's agent, every
worker, preprocessing's pool) therefore asks the kernel for SIGKILL when its parent dies
(Linux's ``PR_SET_PDEATHSIG``; elsewhere a thread watches the parent). A kill is what every
crash point already survives: the run resumes from its last complete checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

#: Set by a launching process for its child: the pid the child must outlive nothing of.
PARENT_ENV = "MMCORE_PARENT_PID"

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:
    """Be killed when the parent process ends (``parent``: the pid it must have; default the
    current one). If the parent is already gone -- it died between starting this process and
    this call -- die now."""
    expected = parent if parent is not None else os.getppid()
    if not _ask_the_kernel():
        threading.Thread(target=_watch, args=(expected,), name="mmcore-lifeline", daemon=True).start()
    if os.getppid() != expected:
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_launcher() -> None:
    """:func:`die_with_parent` for the pid the launcher put in :data:`PARENT_ENV` (nothing when
    it is unset: started by hand, not by mmcore)."""
    value = os.environ.get(PARENT_ENV, "")
    if value.isdigit():
        die_with_parent(int(value))


def _ask_the_kernel() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["PARENT_ENV", "die_with_launcher", "die_with_parent"]
