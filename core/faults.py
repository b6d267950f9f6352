"""Named crash points for crash-and-resume tests: ``MMCORE_TEST_KILL=<tag>:<n>`` makes the
process kill -9 itself when it passes point ``tag`` for the n-th time (a no-op otherwise)."""

from __future__ import annotations

import os
import signal

ENV = "MMCORE_TEST_KILL"


def crash_point(tag: str, n: int) -> None:
    if os.environ.get(ENV) == f"{tag}:{n}":
        os.kill(os.getpid(), signal.SIGKILL)
