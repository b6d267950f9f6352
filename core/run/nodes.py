"""Several machines, one run directory on a shared file system (as DCP and Megatron expect).

Every node runs the same command. Node 0 is the run's owner: it holds the run-directory lock,
runs the single-process stages (download, convert, preprocess, extract, export) and announces
itself in ``.nodes/node-0.json`` with a fresh token. Every other node follows: it waits for that
announcement (a node that never sees it is told its run directory is not shared), then walks
the pipeline with node 0, waiting for node 0's manifest of each single-process stage and
joining torchrun for each distributed one. Inside the distributed stage the workers compare the
token node 0's rank 0 read with the one each node reads: a node looking at another directory
that merely looks like the run (a stale copy) stops at once.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from mmcore.errors import StageError, UsageError
from mmcore.framework.files import atomic_write_json

NODES = ".nodes"
T = TypeVar("T")


def marker(run_root: Path) -> Path:
    return run_root / NODES / "node-0.json"


def announce(run_root: Path, parallel: Any) -> str:
    """Node 0: a fresh token in ``.nodes/node-0.json`` (the previous run's is replaced)."""
    token = secrets.token_hex(16)
    (run_root / NODES).mkdir(parents=True, exist_ok=True)
    atomic_write_json(marker(run_root), {"token": token, "endpoint": parallel.rdzv_endpoint, "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()})
    return token


HEARTBEAT_S = 20.0


def keep_alive(run_root: Path, node_rank: int) -> None:
    """Touch ``.nodes/node-R.alive`` every :data:`HEARTBEAT_S` seconds from a daemon thread, so the
    other nodes can tell a busy node from a dead one."""
    import threading

    path = run_root / NODES / f"node-{node_rank}.alive"

    def beat() -> None:
        while True:
            try:
                path.touch()
            except OSError:
                pass
            time.sleep(HEARTBEAT_S)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    threading.Thread(target=beat, name="mmcore-heartbeat", daemon=True).start()


def node0_silent_for(run_root: Path, node_rank: int) -> float:
    """Seconds since node 0's last heartbeat, by the shared file system's own clock (this node
    touches its own heartbeat file and compares the two modification times: no clock skew)."""
    mine = run_root / NODES / f"node-{node_rank}.alive"
    mine.touch()
    try:
        return max(0.0, mine.stat().st_mtime - (run_root / NODES / "node-0.alive").stat().st_mtime)
    except FileNotFoundError:
        return 0.0  # node 0 has not started beating yet (an older mmcore, or just started)


def read_token(run_root: Path) -> str | None:
    try:
        return str(json.loads(marker(run_root).read_text(encoding="utf-8"))["token"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def wait_until(probe: Callable[[], T | None], *, timeout: float | None, poll: float = 1.0) -> T | None:
    """``probe()`` every ``poll`` seconds until it returns something; None after ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None:
            return found
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll)


def await_node0(run_root: Path, parallel: Any, say: Callable[[str], None]) -> None:
    """A following node: wait for node 0's announcement for this rendezvous endpoint."""

    def announced() -> bool | None:
        try:
            record = json.loads(marker(run_root).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return True if record.get("endpoint") == parallel.rdzv_endpoint else None

    say(f"node {parallel.node_rank} of {parallel.nnodes}: waiting for node 0 to start in {run_root} (up to {parallel.rdzv_timeout_s} s)")
    if wait_until(announced, timeout=parallel.rdzv_timeout_s) is None:
        raise UsageError(
            f"node {parallel.node_rank}: no sign of node 0 in {run_root} after {parallel.rdzv_timeout_s} s",
            hint="every node must see the same run directory: put --run-dir on a file system all nodes share (NFS, Lustre, ...), and start node 0 with the same --rdzv-endpoint",
        )


def check_config(run_root: Path, own: dict[str, Any], node_rank: int) -> None:
    """A following node's config must be node 0's (``parallel.node_rank`` aside)."""
    import yaml

    theirs = yaml.safe_load((run_root / "config.yaml").read_text(encoding="utf-8")) or {}
    for section in sorted(set(own) | set(theirs)):
        mine, other = dict(own.get(section) or {}), dict(theirs.get(section) or {})
        if section == "parallel":
            mine.pop("node_rank", None)
            other.pop("node_rank", None)
        for key in sorted(set(mine) | set(other)):
            if mine.get(key) != other.get(key):
                raise UsageError(f"node {node_rank}: {section}.{key} is {mine.get(key)!r} here but {other.get(key)!r} on node 0; run the same command on every node")


def check_shared(run_root: Path, world: Any) -> None:
    """Inside a distributed stage: every node reads node 0's token from its run directory."""
    import torch.distributed as dist

    box = [read_token(run_root) if world.is_main else None]
    dist.broadcast_object_list(box, src=0)
    mine = read_token(run_root) == box[0] if world.is_local_main else True
    seen: list[Any] = [None] * world.world_size
    dist.all_gather_object(seen, (world.node_rank, mine))  # every rank stops together, none waits on a missing peer
    strangers = sorted({node for node, ok in seen if not ok})
    if strangers:
        raise StageError(
            f"node(s) {', '.join(map(str, strangers))} do not see node 0's run directory {run_root} (their .nodes/node-0.json is missing or differs); put --run-dir on a file system every node shares"
        )


__all__ = ["NODES", "announce", "await_node0", "check_config", "check_shared", "keep_alive", "node0_silent_for", "read_token", "wait_until"]
