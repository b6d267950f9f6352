"""Named crash points for crash-and-resume tests: ``MMCORE_TEST_KILL=<tag>:<n>`` makes the
process kill -9 itself when it passes point ``tag`` for the n-th time (a no-op otherwise);
``<tag>`` alone means ``<tag>:1``. :mod:`mmcore.testing.crash` lists the points.

``MMCORE_TEST_STALL=<tag>:<n>@<rank>`` makes that rank of a distributed run stop there
instead, alive and silent (sleeping), as a hung process would: what the others' collective
timeout (``parallel.collective_timeout_s``) is for."""

from __future__ import annotations

import os
import signal
import time

ENV = "MMCORE_TEST_KILL"
STALL_ENV = "MMCORE_TEST_STALL"


def crash_point(tag: str, n: int = 1) -> None:
    wanted = os.environ.get(ENV)
    if wanted == f"{tag}:{n}" or (n == 1 and wanted == tag):
        os.kill(os.getpid(), signal.SIGKILL)
    stall = os.environ.get(STALL_ENV)
    if stall and stall == f"{tag}:{n}@{os.environ.get('RANK', '0')}":
        while True:
            time.sleep(3600)
