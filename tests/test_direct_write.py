"""Files written past the page cache (mmcore.framework.direct_write): the same bytes as a plain
write at every length around the block and buffer edges, on file systems that take O_DIRECT and
on those that refuse it (at open or at the first write)."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from mmcore.errors import StageError
from mmcore.framework import direct_write
from mmcore.framework.direct_write import BLOCK, DirectFile

BUFFER = 2 * BLOCK  # small, so a few KiB cross every edge: block, buffer, several buffers


def _write(path: Path, source: Path, pieces: list[tuple[str, int, int]]) -> tuple[bytes, bool]:
    """Write ``pieces`` (("bytes", n, seed) or ("copy", offset, n)) through a DirectFile; the bytes
    a plain write would have written, and whether the file went past the page cache."""
    data = source.read_bytes()
    expected = b""
    fd = os.open(source, os.O_RDONLY)
    try:
        with DirectFile(path, buffer_bytes=BUFFER) as out:
            for kind, a, b in pieces:
                if kind == "bytes":
                    chunk = random.Random(b).randbytes(a)
                    out.write(chunk)
                    expected += chunk
                else:
                    out.copy_from(fd, a, b, source.name)
                    expected += data[a : a + b]
            direct = out.direct
    finally:
        os.close(fd)
    return expected, direct


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source.bin"
    path.write_bytes(random.Random(0).randbytes(5 * BUFFER + 123))
    return path


LAYOUTS = {
    "empty": [],
    "one byte": [("bytes", 1, 1)],
    "a block less one": [("bytes", BLOCK - 1, 2)],
    "a block": [("copy", 0, BLOCK)],
    "a block and one": [("bytes", 8, 3), ("copy", 17, BLOCK - 7)],
    # a safetensors shard's shape: a header of odd length, then ranges at odd offsets across buffers
    "header and ranges": [("bytes", 8, 4), ("bytes", 613, 5), ("copy", 3, 3 * BUFFER + 1), ("copy", 4 * BUFFER + 9, BUFFER - 1), ("copy", 1, 5)],
    "exactly two buffers": [("copy", 64, 2 * BUFFER)],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_file_holds_exactly_what_was_written(tmp_path: Path, source: Path, layout: str) -> None:
    expected, _ = _write(tmp_path / "out.bin", source, LAYOUTS[layout])
    assert (tmp_path / "out.bin").read_bytes() == expected


def test_without_o_direct_the_same_bytes_go_through_the_page_cache(tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct_write, "O_DIRECT", 0)  # a platform without it (macOS)
    expected, direct = _write(tmp_path / "out.bin", source, LAYOUTS["header and ranges"])
    assert not direct and (tmp_path / "out.bin").read_bytes() == expected


@pytest.mark.skipif(not direct_write.O_DIRECT, reason="no O_DIRECT on this platform")
def test_a_file_system_that_refuses_direct_writes_gets_them_through_the_page_cache(tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some file systems open with O_DIRECT and refuse the write (EINVAL); the writer drops the
    flag and goes on, no byte lost or doubled."""
    import fcntl

    real_pwritev, refused = os.pwritev, []

    def refusing(fd: int, buffers, offset: int) -> int:  # type: ignore[no-untyped-def]
        if fcntl.fcntl(fd, fcntl.F_GETFL) & direct_write.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", refusing)
    expected, direct = _write(tmp_path / "out.bin", source, LAYOUTS["header and ranges"])
    assert refused == [0] and not direct  # refused once, at the first write
    assert (tmp_path / "out.bin").read_bytes() == expected


def test_a_short_source_is_one_line_naming_it(tmp_path: Path, source: Path) -> None:
    with pytest.raises(StageError, match=r"^source\.bin: truncated: 100 bytes missing$"):
        _write(tmp_path / "out.bin", source, [("copy", source.stat().st_size - 50, 150)])
