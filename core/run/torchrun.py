"""torchrun as :mod:`mmcore.run.launch` starts it, less the launcher's own traceback when a worker
fails: every worker has already left its one-line error for the launching command
(:mod:`mmcore.run.worker_errors`), and the exit code says the rest; a worker killed by a signal (the out-of-memory killer's SIGKILL) prints
nothing, so this says which rank it was and exits 128 + the signal's number
(``python -m mmcore.run.torchrun <torchrun arguments>``)."""

from __future__ import annotations

import os
import sys

#: the exit code of a run whose worker a signal killed: 128 + the signal's number, as a shell reports it
KILLED_BY_SIGNAL = 128


def main() -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from mmcore.run.lifeline import PARENT_ENV, die_with_launcher

    # torchrun puts each worker in a session of its own, out of reach of a signal to the run's
    # process group: this agent dies with mmcore, and each worker with this agent
    die_with_launcher()
    os.environ[PARENT_ENV] = str(os.getpid())

    try:
        torchrun()
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode < 0:  # killed by a signal: the worker said nothing, so say who and how
            why = " (the kernel's out-of-memory killer sends it, as does kill -9)" if failure.signal_name() == "SIGKILL" else ""
            print(f"error: rank {rank} (pid {failure.pid}) was killed by {failure.signal_name()}{why}", file=sys.stderr, flush=True)
            return KILLED_BY_SIGNAL - failure.exitcode
        return failure.exitcode
    return 0


if __name__ == "__main__":
    sys.exit(main())
