"""Video writing and reading: the same frames always give the same file and the same pixels."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import numpy as np
import pytest

from mmcore.data.video import probe, resize_crop, sample_frames, write_mp4


def moving_square(seed: int, frames: int = 9, size: int = 32) -> np.ndarray:
    rng = random.Random(seed)
    clip = np.full((frames, size, size, 3), 255, dtype=np.uint8)
    colour = tuple(rng.randrange(256) for _ in range(3))
    x, y, dx = rng.randrange(size - 8), rng.randrange(size - 8), rng.choice([-2, 2])
    for t in range(frames):
        left = min(max(x + dx * t, 0), size - 8)
        clip[t, y : y + 8, left : left + 8] = colour
    return clip


def test_the_same_frames_encode_to_the_same_bytes_whatever_the_heap_held(tmp_path: Path) -> None:
    """x264's AVX-512 kernels read uninitialised memory, so on such a CPU an encode depended on
    what the process had freed before it (7 different files in 60 encodes of one clip); demo
    data written in two run directories then decoded to different pixels. Each encode here
    follows a fresh layer of random garbage in freed memory."""
    clips = [moving_square(seed) for seed in range(4)]
    junk: list[bytes] = []
    seen: list[set[str]] = [set() for _ in clips]
    for attempt in range(25):
        for i, clip in enumerate(clips):
            junk += [os.urandom(size) for size in (4096, 16384, 65536, 200_000)]
            del junk[:3]
            path = tmp_path / f"c{i}-{attempt}.mp4"
            write_mp4(path, clip, 8)
            seen[i].add(hashlib.sha256(path.read_bytes()).hexdigest())
    assert [len(s) for s in seen] == [1] * len(clips)


def test_decoding_and_resizing_give_the_same_pixels_every_time(tmp_path: Path) -> None:
    path = tmp_path / "c.mp4"
    write_mp4(path, moving_square(7, frames=12, size=48), 8)
    info = probe(path)
    assert (info.frames, info.height, info.width) == (12, 48, 48)
    outs = {resize_crop(sample_frames(path, info, fps=4, count=5), 32, 40).tobytes() for _ in range(5)}
    assert len(outs) == 1
    frames = np.frombuffer(outs.pop(), dtype=np.uint8).reshape(5, 32, 40, 3)
    assert frames.min() < 100 < frames.max()  # the square survives encoding, sampling and resizing


def test_size_limits_make_absurd_media_a_bad_sample_before_decoding(tmp_path: Path) -> None:
    from types import SimpleNamespace

    import numpy as np

    from mmcore.data import media
    from mmcore.data.video import MediaError, load_image, probe, write_mp4

    write_mp4(tmp_path / "clip.mp4", np.zeros((12, 16, 16, 3), np.uint8), 8)  # 1.5 s
    from PIL import Image

    Image.new("RGB", (64, 64)).save(tmp_path / "big.png")
    try:
        media.media_limits(SimpleNamespace(max_image_pixels=1000, max_media_seconds=1.0))
        with pytest.raises(MediaError, match=r"video .*clip.mp4 lasts 1.5 s, over the limit data.max_media_seconds=1"):
            probe(tmp_path / "clip.mp4")
        with pytest.raises(MediaError, match=r"image .*big.png is 64x64 = 4096 pixels, over the limit data.max_image_pixels=1000"):
            load_image(tmp_path / "big.png")
    finally:
        media.media_limits(SimpleNamespace(max_image_pixels=89_478_485, max_media_seconds=3600.0))
    assert probe(tmp_path / "clip.mp4").frames == 12


def test_every_truncation_of_an_mp4_is_an_error_that_says_what_is_wrong(tmp_path: Path) -> None:
    """A file cut anywhere either still probes or is a MediaError naming the file and calling
    it truncated or damaged: never PyAV's bare 'tuple index out of range' (no video stream left)
    nor an AttributeError on a stream without a frame size."""
    import re

    from mmcore.data.media import MediaError

    write_mp4(tmp_path / "whole.mp4", moving_square(0, frames=12), 8)
    data = (tmp_path / "whole.mp4").read_bytes()
    cut = tmp_path / "cut.mp4"
    said = set()
    for size in range(0, len(data), 7):
        cut.write_bytes(data[:size])
        try:
            info = probe(cut)
        except MediaError as exc:
            assert str(exc).startswith(f"unreadable video {cut}: ") and str(exc).endswith("(a truncated or damaged file, or not a video)"), str(exc)
            said.add(re.sub(r"\[Errno -?\d+\] |: '.*'", "", str(exc).split(": ", 1)[1]).split(" (")[0])
            continue
        sample_frames(cut, info, fps=8, count=info.frames)  # what probes also decodes
    assert {"it holds no video stream", "not one frame decodes"} <= said, said
