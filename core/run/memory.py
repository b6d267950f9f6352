"""Between stages of one ``mmcore run`` process: the memory a finished stage freed, handed back."""

from __future__ import annotations

import gc
import sys


def return_freed_memory() -> None:
    """Collect what the finished stage left unreachable and, on Linux (glibc), return the freed
    heap to the operating system: without it a later stage's peak resident memory starts from
    the earlier stage's (measured: qwen2vl's preprocess left ~200 MiB of freed heap resident
    through training; BENCHMARKS.md, the peers rows)."""
    gc.collect()
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim through
            pass
