"""Starting a stage on several processes through torchrun, from the same command line.

The parent (the user's ``mmcore`` command) prepares the stage, then runs
``python -m mmcore.run.torchrun <torchrun options> -m mmcore.run.worker <stage options>`` (torchrun, quiet when a worker fails).
Every worker reads the run directory's ``config.yaml``: only paths cross the boundary.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from mmcore.config import ParallelSection
from mmcore.errors import UsageError
from mmcore.run.worker_errors import ERRORS_ENV, collected

WORKER_ENV = "MMCORE_WORKER"


def inside_worker() -> bool:
    """True in a process torchrun started (it sets these), where no further launch may happen."""
    return bool(os.environ.get(WORKER_ENV)) or "TORCHELASTIC_RUN_ID" in os.environ


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_args(parallel: ParallelSection) -> list[str]:
    """torchrun's options for the ``parallel`` section."""
    args = ["--nproc-per-node", str(parallel.nproc_per_node)]
    if parallel.nnodes == 1:
        endpoint = parallel.rdzv_endpoint or f"127.0.0.1:{free_port()}"
        return [*args, "--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    if not parallel.rdzv_endpoint:
        raise UsageError("parallel.nnodes > 1 needs parallel.rdzv_endpoint=HOST:PORT (the same on every node)")
    if parallel.node_rank >= parallel.nnodes:
        raise UsageError(f"parallel.node_rank={parallel.node_rank} must be below parallel.nnodes={parallel.nnodes}")
    return [
        *args,
        "--nnodes",
        str(parallel.nnodes),
        "--node-rank",
        str(parallel.node_rank),
        "--rdzv-endpoint",
        parallel.rdzv_endpoint,
        "--master-addr",
        parallel.rdzv_endpoint.rsplit(":", 1)[0],
        "--master-port",
        parallel.rdzv_endpoint.rsplit(":", 1)[1],
        # the static rendezvous these options select waits for the other nodes for "timeout"
        # (torchrun's default 600 s), not "join_timeout": both, so the wait is the one configured
        "--rdzv-conf",
        f"join_timeout={parallel.rdzv_timeout_s},timeout={parallel.rdzv_timeout_s}",
    ]


def launch(parallel: ParallelSection, worker_args: Sequence[str], *, what: str) -> None:
    """Run ``mmcore.run.worker`` under torchrun and wait; Ctrl-C stops every worker."""
    cmd = [sys.executable, "-m", "mmcore.run.torchrun", *torchrun_args(parallel), "-m", "mmcore.run.worker", *worker_args]
    from mmcore.run.lifeline import PARENT_ENV

    env = dict(os.environ, **{WORKER_ENV: "1", PARENT_ENV: str(os.getpid())})
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets where it is unset, without its banner saying so
    if parallel.nnodes > 1:
        from mmcore.framework.console import say

        say(
            f"{what}: node {parallel.node_rank} of {parallel.nnodes} waiting for the others at {parallel.rdzv_endpoint} "
            f"(up to parallel.rdzv_timeout_s={parallel.rdzv_timeout_s} s; Ctrl-C stops; finished work is kept)"
        )
    with tempfile.TemporaryDirectory(prefix="mmcore-worker-errors-") as errors:
        env[ERRORS_ENV] = errors
        proc = subprocess.Popen(cmd, env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        if code != 0:
            hint = f"a node that never joined ends the rendezvous after parallel.rdzv_timeout_s={parallel.rdzv_timeout_s} s" if parallel.nnodes > 1 else None
            raise collected(Path(errors), parallel.nproc_per_node * parallel.nnodes, what, code, hint)
