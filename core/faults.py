"""Named crash points for crash-and-resume tests: ``MMCORE_TEST_KILL=<tag>:<n>`` makes the
process kill -9 itself when it passes point ``tag`` for the n-th time (a no-op otherwise);
``<tag>`` alone means ``<tag>:1``. :mod:`mmcore.testing.crash` lists the points."""

from __future__ import annotations

import os
import signal

ENV = "MMCORE_TEST_KILL"


def crash_point(tag: str, n: int = 1) -> None:
    wanted = os.environ.get(ENV)
    if wanted == f"{tag}:{n}" or (n == 1 and wanted == tag):
        os.kill(os.getpid(), signal.SIGKILL)
