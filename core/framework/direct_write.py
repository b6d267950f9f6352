"""A large file written front to back past the page cache (``O_DIRECT``).

Exports and conversions write gigabytes their process never reads again. Written through the page
cache, each page is allocated, copied into, dirtied, written back later and flushed by the final
fsync, and that kernel time is most of the work: DCP -> HF of a 4.1 GiB checkpoint spent 3.3-6.8 s
of system time copying into cached shards against 1.0-1.3 s here (`bench/convert_speed.py`; the
scratch A/B in the issue-47 note). Here bytes are gathered into a page-aligned buffer
(``pread`` from the source, which stays cached) and written straight to the disk in whole blocks;
the last block is padded and the file cut back to its length.

Where the file system refuses ``O_DIRECT`` (at open or at the first write) or the platform has
none, the same calls write through the page cache instead: same bytes, slower.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from types import TracebackType

BUFFER_BYTES = 16 << 20  # per open file; 64 MiB measured no faster
BLOCK = 4096  # O_DIRECT offsets and lengths are multiples of the logical block (512 or 4096)
O_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectFile:
    """``path`` created (truncated) and written sequentially: :meth:`write` bytes,
    :meth:`copy_from` a range of another file; :meth:`close` writes what is buffered and cuts the
    file to its length. Not flushed to disk's cache: fsync it (or its file system) after."""

    def __init__(self, path: Path, buffer_bytes: int = BUFFER_BYTES) -> None:
        if buffer_bytes % BLOCK:
            raise ValueError(f"buffer_bytes {buffer_bytes}: a multiple of {BLOCK}")
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            self.fd = os.open(path, flags | O_DIRECT, 0o644)
            self.direct = bool(O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.fd = os.open(path, flags, 0o644)
            self.direct = False
        self._map = mmap.mmap(-1, buffer_bytes)  # anonymous memory: page-aligned, as O_DIRECT needs
        self._view = memoryview(self._map)
        self._fill = 0  # bytes in the buffer
        self._flushed = 0  # bytes on disk: always a multiple of the buffer's size until close

    def write(self, data: bytes) -> None:
        done = 0
        while done < len(data):
            n = min(len(self._view) - self._fill, len(data) - done)
            self._view[self._fill : self._fill + n] = data[done : done + n]
            self._fill += n
            done += n
            if self._fill == len(self._view):
                self._flush(len(self._view))

    def copy_from(self, src_fd: int, offset: int, nbytes: int, name: str) -> None:
        """``nbytes`` of the open file ``src_fd`` from ``offset`` (``name`` names it in errors)."""
        from mmcore.errors import StageError

        done = 0
        while done < nbytes:
            n = min(len(self._view) - self._fill, nbytes - done)
            got = os.preadv(src_fd, [self._view[self._fill : self._fill + n]], offset + done)
            if got <= 0:
                raise StageError(f"{name}: truncated: {nbytes - done} bytes missing")
            self._fill += got
            done += got
            if self._fill == len(self._view):
                self._flush(len(self._view))

    def close(self) -> int:
        """Write the rest, cut the file to its length; the length."""
        try:
            length = self._flushed + self._fill
            if self._fill:
                padded = -(-self._fill // BLOCK) * BLOCK
                self._view[self._fill : padded] = bytes(padded - self._fill)
                self._flush(padded)
                os.ftruncate(self.fd, length)
            return length
        finally:
            self._release()

    def _flush(self, nbytes: int) -> None:
        done = 0
        while done < nbytes:
            try:
                done += os.pwritev(self.fd, [self._view[done:nbytes]], self._flushed + done)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                import fcntl  # Linux's: only there is O_DIRECT set

                # opened, but this file system refuses direct writes: go on through the page cache
                fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~O_DIRECT)
                self.direct = False
        self._flushed += self._fill
        self._fill = 0

    def _release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self._view.release()
            self._map.close()

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self._release()
