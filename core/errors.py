"""Errors a user sees as one line, never as a traceback (unless ``--debug``)."""

from __future__ import annotations


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


def file_system_error(exc: BaseException, doing: str) -> "MmcoreError | None":
    """A one-line error for a full, read-only or forbidden file system (None for other errors)."""
    import errno

    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    name = errno.errorcode.get(exc.errno, "")
    if name not in _FS_ADVICE:
        return None
    where = f" ({exc.filename})" if exc.filename else ""
    return MmcoreError(f"{doing}: {exc.strerror or name}{where}", hint=_FS_ADVICE[name])
