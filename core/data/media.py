"""What every media decoder raises, and the size limits every decoder applies.

A file that cannot be used is a :class:`MediaError` naming it, for the bad-sample policy. An
absurd size (a decompression bomb, a day-long recording) is one too, found from the header
before decoding where the format says it: ``data.max_image_pixels`` and ``data.max_media_seconds``,
set for the process by :func:`media_limits` when a preprocess stage starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class MediaError(Exception):
    """A media file that cannot be used (unreadable, truncated, too short, too long)."""


#: The largest image or video frame decoded (width x height): PIL's own default.
MAX_PIXELS = 89_478_485
#: The longest audio or video decoded, in seconds.
MAX_SECONDS = 3600.0


def media_limits(data: Any) -> None:
    """Apply a data section's size limits to every decoder of this process."""
    global MAX_PIXELS, MAX_SECONDS
    MAX_PIXELS = int(getattr(data, "max_image_pixels", MAX_PIXELS))
    MAX_SECONDS = float(getattr(data, "max_media_seconds", MAX_SECONDS))


def check_pixels(path: Path, width: int, height: int, what: str) -> None:
    if width * height > MAX_PIXELS:
        raise MediaError(f"{what} {path} is {width}x{height} = {width * height} pixels, over the limit data.max_image_pixels={MAX_PIXELS}")


def check_seconds(path: Path, seconds: float, what: str) -> None:
    if seconds > MAX_SECONDS:
        raise MediaError(f"{what} {path} lasts {seconds:.1f} s, over the limit data.max_media_seconds={MAX_SECONDS:g}")
