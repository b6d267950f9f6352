"""Errors a user sees as one line, never as a traceback (unless ``--debug``)."""

from __future__ import annotations

import os


class MmcoreError(Exception):
    """An error caused by the user's input or environment, printed as one line.

    ``exit_code`` follows the shell convention the CLI uses: 2 for bad usage or
    configuration, 1 for a failure while doing the work.
    """

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def one_line(self) -> str:
        text = str(self)
        return f"{text} (hint: {self.hint})" if self.hint else text


class ConfigError(MmcoreError):
    """A config file, preset or override that does not validate."""

    exit_code = 2


class UsageError(MmcoreError):
    """A command line that cannot work (unknown pack, stage not ready, ...)."""

    exit_code = 2


class PackError(MmcoreError):
    """A pack that cannot be loaded or is provided twice."""

    exit_code = 2


class StageError(MmcoreError):
    """A stage that failed for a reason the pack could name (bad sample, missing file, ...)."""

    exit_code = 1


def missing_dependency(module: str, purpose: str, distribution: str | None = None) -> MmcoreError:
    """The one-line error for an optional library that core code needs and is not installed
    (packs that use that code depend on it; core itself does not)."""
    name = distribution or module
    return MmcoreError(f"{purpose} needs {name}, which is not installed", hint=f"pip install {name}")


#: What to do about the file-system faults a user can fix, by errno name.
_FS_ADVICE = {
    "ENOSPC": "free disk space or point --run-dir at a larger disk, then rerun: finished work is kept",
    "EDQUOT": "the disk quota is used up: free space or point --run-dir elsewhere, then rerun",
    "EROFS": "the file system is read-only: point --run-dir at a writable place",
    "EACCES": "no permission to write there: fix the permissions or point --run-dir elsewhere",
    "EPERM": "no permission to write there: fix the permissions or point --run-dir elsewhere",
}


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, its causes, or what a library gathered from its ranks
    (torch.distributed.checkpoint's ``CheckpointException.failures``), whose message is a
    flattened traceback per rank."""
    stack: list[object] = [exc]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            stack.extend(f[0] if isinstance(f, tuple) and f else f for f in failures.values())  # (exception, traceback) per rank
        stack.extend((current.__cause__, current.__context__))
    return None


def file_system_error(exc: BaseException, doing: str, where: "str | None" = None) -> "MmcoreError | None":
    """A one-line error for a full, read-only or forbidden file system (None for other errors),
    naming the path (``where`` when the error names none) and, for a full disk, what is free."""
    import errno

    inner = os_error_in(exc)
    if inner is None:
        return None
    name = errno.errorcode.get(inner.errno or 0, "")
    if name not in _FS_ADVICE:
        return None
    path = inner.filename or where
    detail = f" ({path}{_free_at(path) if name in ('ENOSPC', 'EDQUOT') else ''})" if path else ""
    return MmcoreError(f"{doing}: {inner.strerror or name}{detail}", hint=_FS_ADVICE[name])


def _free_at(path: "str | os.PathLike[str]") -> str:
    import shutil
    from pathlib import Path

    from mmcore.framework.files import size_text

    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return f"; {size_text(shutil.disk_usage(probe).free)} free there"
    except OSError:
        return ""
