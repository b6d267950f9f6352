"""Every process a run starts ends with it (issue 49): the parent-death signal and the
run-directory lock that waits for a killed run's workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmcore.run import lock as runlock
from mmcore.errors import UsageError
from mmcore.testing.crash import survivors

LINUX = Path("/proc/self/stat").exists()

# A parent that starts a child asking to die with it, prints the child's pid, then waits.
_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {child!r}])
print(child.pid, flush=True)
child.wait()
"""
_CHILD = """
import time
import mmcore.run.lifeline as lifeline
if {watch}:
    lifeline._ask_the_kernel = lambda: False  # the thread that watches the parent, as off Linux
lifeline.die_with_parent()
time.sleep(120)
"""


@pytest.mark.skipif(not LINUX, reason="reads process states from Linux's /proc")
@pytest.mark.parametrize("how", ["kernel", "watching thread"])
def test_a_child_dies_when_its_parent_is_killed(how: str) -> None:
    child_code = _CHILD.format(watch=how != "kernel")
    parent = subprocess.Popen([sys.executable, "-c", _PARENT.format(child=child_code)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has asked (importing mmcore takes a moment)
    assert survivors([child], wait=0) == [child]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert survivors([child], wait=5) == []


_WORKER = """
import sys, time
from pathlib import Path
from mmcore.run.lock import hold_as_worker
held = hold_as_worker(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _worker(root: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(root), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_new_run_waits_for_a_dying_worker_then_takes_the_directory(tmp_path: Path) -> None:
    worker = _worker(tmp_path, 1.0)
    start = time.monotonic()
    handle = runlock.lock_run(tmp_path)
    assert time.monotonic() - start >= 0.5 and worker.wait() == 0
    handle.close()


def test_a_worker_that_lives_on_is_named_and_the_run_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runlock, "WORKERS_GRACE_S", 0.5)
    worker = _worker(tmp_path, 60)
    try:
        with pytest.raises(UsageError) as refused:
            runlock.lock_run(tmp_path)
        message = refused.value.one_line()
        assert "worker processes of an earlier run are still alive after 0 s" in message or "still alive after 1 s" in message
        if LINUX:
            assert f"(pid {worker.pid})" in message
    finally:
        worker.kill()
        worker.wait()
    runlock.lock_run(tmp_path).close()  # its lock went with it


@pytest.mark.skipif(not LINUX, reason="names holders from Linux's /proc/locks")
def test_the_run_lock_names_the_process_that_holds_it(tmp_path: Path) -> None:
    held = runlock.lock_run(tmp_path)
    code = f"from pathlib import Path\nfrom mmcore.run.lock import lock_run\nlock_run(Path({str(tmp_path)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and f"is in use by another mmcore process (pid {os.getpid()})" in proc.stderr
    held.close()
