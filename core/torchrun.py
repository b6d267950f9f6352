"""torchrun as :mod:`mmcore.launch` starts it, less the launcher's own traceback when a worker
fails: every worker has already printed its one-line error (``error (rank N): ...``), and the
exit code says the rest (``python -m mmcore.torchrun <torchrun arguments>``)."""

from __future__ import annotations

import sys


def main() -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except ChildFailedError as exc:
        _, failure = exc.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 1  # a signal is negative: any failure is non-zero
    return 0


if __name__ == "__main__":
    sys.exit(main())
