"""Real media files for the qwen2vl tests, made offline (PIL images, PyAV-encoded H.264 video)."""

from __future__ import annotations

from pathlib import Path


def write_image(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def write_video(path: Path, frames: int = 8, fps: int = 4, size: int = 56) -> None:
    import av
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            array = np.zeros((size, size, 3), dtype=np.uint8)
            array[:, : (i + 1) * size // frames] = (200, 40, 40)
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
