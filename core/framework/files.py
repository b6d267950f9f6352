"""Crash-safe file writes and content hashing.

A file written with :func:`atomic_write_bytes` is either the old content or the new,
never half of either: written to a temporary file beside it, flushed to disk, renamed over.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

_CHUNK = 8 << 20


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (best effort: not every file system can)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def ensure_free_space(folder: Path, need_bytes: int, what: str, *, hint: str = "free disk space or point --run-dir at a larger disk") -> None:
    """Refuse to start writing ``need_bytes`` into ``folder`` when the disk cannot hold them
    (``MMCORE_MIN_FREE_BYTES`` more are kept free; a full disk mid-write costs the work done)."""
    import shutil

    from mmcore.errors import StageError

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    reserve = int(os.environ.get("MMCORE_MIN_FREE_BYTES", str(256 << 20)))
    if free < need_bytes + reserve:
        raise StageError(
            f"{what} needs about {size_text(need_bytes)} in {folder} plus {size_text(reserve)} kept free (MMCORE_MIN_FREE_BYTES), and only {size_text(free)} are free",
            hint=hint,
        )


def size_text(count: int | float) -> str:
    """Bytes in the unit that shows them with three significant digits (a tiny model's 2.8 MiB
    is not "0.00 GiB")."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} EiB"


def fsync_file(path: Path) -> None:
    """Flush a file another library wrote (safetensors' ``save_file``) to disk before renaming it."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json_object(path: str | os.PathLike[str], holds: str) -> dict[str, Any]:
    """A JSON object from ``path`` (a released model's config file); a missing file, text that is
    not JSON, or JSON that is not an object is one :class:`~mmcore.errors.StageError` line naming
    the file (``holds``: what the folder should hold, for the missing file's message)."""
    from mmcore.errors import StageError

    path = Path(path)
    if not path.is_file():
        raise StageError(f"{path}: missing ({holds})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise StageError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise StageError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def iter_files(path: Path) -> Iterable[Path]:
    """Files under ``path`` in a stable order, skipping hidden temporary files."""
    if path.is_file():
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name.startswith(".") and name.endswith(".tmp"):
                continue
            yield Path(root) / name


def stat_key(path: Path) -> list[int]:
    """(size, mtime_ns) of a file, or of every file of a directory folded together."""
    size = mtime = count = 0
    for file in iter_files(path):
        st = file.stat()
        size += st.st_size
        mtime = max(mtime, st.st_mtime_ns)
        count += 1
    return [size, mtime, count]


def sha256_tree(path: Path) -> str:
    """Content hash of a file, or of a directory: its relative paths and their files' hashes."""
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in iter_files(path):
        digest.update(file.relative_to(path).as_posix().encode())
        digest.update(b"\0")
        digest.update(sha256_file(file).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def sha256_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` and the folder itself to disk: one pass at the end,
    while the kernel has written most pages back in the background already.

    On Linux a tree of many files (a converted DCP checkpoint: one file per tensor) is flushed by
    one ``syncfs`` of its file system: fsyncing the files one by one waits for each file's
    journal commit in turn, which made HF -> DCP of a Qwen2-VL-2B-shaped checkpoint (4 layers,
    106 files, 1 GiB) take 1.65-2.1 s where ``cp -r`` + ``sync`` took 1.18; ``syncfs`` took
    1.18-1.48 (bench/convert_speed.py). A few files, or no ``syncfs``, are fsynced one by one."""
    paths = [*sorted(p for p in folder.rglob("*") if p.is_file()), folder]
    if len(paths) > _FSYNC_ONE_BY_ONE and _syncfs(folder):
        return
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_FSYNC_ONE_BY_ONE = 16  # files: at most this many are fsynced each, more by one syncfs


def _syncfs(folder: Path) -> bool:
    """``syncfs(2)`` on the file system holding ``folder``: True once it returned 0; False where
    the C library has none (not Linux / glibc) or it failed (then fsync file by file)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs  # the process's own C library
    except (OSError, AttributeError):
        return False
    fd = os.open(folder, os.O_RDONLY)
    try:
        return syncfs(fd) == 0
    finally:
        os.close(fd)
