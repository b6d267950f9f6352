"""Video and image decoding for every pack: probe once, sample frames in time, resize into buckets.

PyAV (bundled FFmpeg) decodes; no torchvision. Images are one-frame videos. Every failure is a
:class:`MediaError` naming the file, for the bad-sample policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from mmcore.data.media import MediaError, check_pixels, check_seconds

__all__ = ["MediaError", "Probe", "probe", "load_image", "sample_frames", "frames_at", "choose_bucket", "resize_crop", "write_mp4", "contact_sheet"]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


@dataclass(frozen=True)
class Probe:
    frames: int
    fps: float
    height: int
    width: int

    @property
    def seconds(self) -> float:
        return self.frames / self.fps if self.fps else 0.0


def probe(path: Path) -> Probe:
    """Frame count, frame rate and size, decoding the stream once (containers often lie about counts)."""
    if path.suffix.lower() in IMAGE_SUFFIXES:
        image = load_image(path)
        return Probe(1, 0.0, image.height, image.width)
    import av

    try:
        with av.open(str(path)) as container:
            stream = _video_stream(path, container)
            check_pixels(path, stream.width, stream.height, "video")
            if container.duration:
                check_seconds(path, container.duration / 1e6, "video")
            fps = float(stream.average_rate or stream.guessed_rate or 0) or 0.0
            count = 0
            for _ in container.decode(stream):  # counted, not trusted from the header
                count += 1
                if fps and count % 1024 == 0:
                    check_seconds(path, count / fps, "video")
            if not count:
                raise MediaError(f"unreadable video {path}: not one frame decodes ({DAMAGED})")
            return Probe(count, fps, stream.height, stream.width)
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"unreadable video {path}: {exc} ({DAMAGED})") from None


#: What a container that opens but holds no decodable video usually is.
DAMAGED = "a truncated or damaged file, or not a video"


def _video_stream(path: Path, container: Any) -> Any:
    """The container's first video stream, with a frame size; a truncated file often has
    neither (PyAV then raises IndexError, or AttributeError on the size)."""
    if not container.streams.video:
        raise MediaError(f"unreadable video {path}: it holds no video stream ({DAMAGED})")
    stream = container.streams.video[0]
    try:
        if stream.width and stream.height:
            return stream
    except AttributeError:
        pass
    raise MediaError(f"unreadable video {path}: its video stream has no frame size ({DAMAGED})")


def load_image(path: Path) -> Any:
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = None  # the limit is ours (MAX_PIXELS), checked on the header below
    try:
        with Image.open(path) as image:  # reads the header only: the size is known before decoding
            check_pixels(path, image.width, image.height, "image")
            image.load()
            return image.convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as exc:
        raise MediaError(f"unreadable image {path}: {exc}") from None


def sample_frames(path: Path, info: Probe, *, fps: float, count: int) -> list[Any]:
    """``count`` frames at ``fps`` from the start (PIL images); too short a video is a MediaError."""
    if info.frames == 1 and count == 1:
        return [load_image(path)] if path.suffix.lower() in IMAGE_SUFFIXES else _decode(path, [0])
    if info.frames <= 1:
        raise MediaError(f"{path} is a single frame; {count} frames are needed")
    step = (info.fps / fps) if (fps and info.fps) else 1.0
    wanted = [round(i * step) for i in range(count)]
    if wanted[-1] >= info.frames:
        need = (count - 1) / fps if fps else count
        raise MediaError(f"video {path} is too short: {info.frames} frames at {info.fps:g} fps, {count} frames at {fps:g} fps need {need:.2f} s")
    return _decode(path, wanted)


def _decode(path: Path, indices: Sequence[int]) -> list[Any]:
    import av

    wanted = set(indices)
    found: dict[int, Any] = {}
    try:
        with av.open(str(path)) as container:
            for i, frame in enumerate(container.decode(_video_stream(path, container))):
                if i in wanted:
                    found[i] = frame.to_image().convert("RGB")
                if i >= max(indices):
                    break
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"unreadable video {path}: {exc} ({DAMAGED})") from None
    if len(found) != len(wanted):
        raise MediaError(f"video {path} ended early: decoded {len(found)} of {len(wanted)} sampled frames")
    return [found[i] for i in indices]


def frames_at(info: Probe, fps: float) -> int:
    """How many frames sampling at ``fps`` can take from the clip."""
    if info.frames <= 1 or not info.fps:
        return info.frames
    return int((info.frames - 1) * fps / info.fps + 1e-9) + 1


def choose_bucket(info: Probe, buckets: Sequence[tuple[int, int, int]], fps: float) -> tuple[int, int, int] | None:
    """The (height, width, frames) bucket closest in aspect ratio among those the clip is long enough for."""
    available = frames_at(info, fps)
    fitting = [b for b in buckets if b[2] <= available]
    if not fitting:
        return None
    ratio = info.height / max(info.width, 1)
    return min(fitting, key=lambda b: (abs(b[0] / b[1] - ratio), -b[2], -(b[0] * b[1])))


def resize_crop(images: list[Any], height: int, width: int) -> Any:
    """Scale to cover (height, width), centre-crop, stack as uint8 (frames, height, width, 3)."""
    import numpy as np
    from PIL import Image

    out = []
    for image in images:
        scale = max(height / image.height, width / image.width)
        size = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC)
        left, top = (size[0] - width) // 2, (size[1] - height) // 2
        out.append(np.asarray(image.crop((left, top, left + width, top + height)), dtype=np.uint8))
    return np.stack(out)


def x264_options() -> dict[str, str]:
    """libx264 options that make the encoded bytes a function of the frames alone.

    x264's AVX-512 kernels read memory they did not initialise: on a CPU with AVX-512 the same
    frames encode to different bitstreams (and, after decoding, different pixels) depending on
    what the process's heap held before — measured here, 7 distinct outputs in 60 encodes of one
    9-frame 32x32 clip, against 1 with the instruction set capped at AVX2. Capping at AVX2 on
    every x86 CPU that has it also gives all such machines the same code path, so the same
    frames give the same file on each. Elsewhere (ARM, CPUs without AVX2) x264 picks.
    """
    return {"x264-params": "asm=AVX2"} if "avx2" in cpu_flags() else {}


def cpu_flags() -> set[str]:
    """The x86 CPU's feature flags as Linux reports them (empty on other systems)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def write_mp4(path: Path, frames: Any, fps: float, audio: tuple[Any, int] | None = None) -> None:
    """Frames (F, H, W, 3) uint8 -> H.264 mp4, the same bytes for the same frames (see :func:`x264_options`);
    ``audio``: (mono float samples in [-1, 1], sample rate), muxed as an AAC sound track."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=max(1, round(fps)), options=x264_options())
        stream.height, stream.width = int(frames.shape[1]), int(frames.shape[2])
        stream.pix_fmt = "yuv420p"
        sound = container.add_stream("aac", rate=audio[1], layout="mono") if audio is not None else None
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            _mux_audio(container, sound, audio[0], audio[1])


def _mux_audio(container: Any, stream: Any, samples: Any, rate: int) -> None:
    """Mono float samples encoded into ``stream`` in the encoder's frame size."""
    import av
    import numpy as np

    data = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    size = stream.codec_context.frame_size or 1024
    for start in range(0, len(data), size):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data[start : start + size][None]), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = rate, start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)


def contact_sheet(path: Path, rows: list[Any], *, scale: int = 2) -> None:
    """One row of frames per video, side by side, as a PNG to look at."""
    import numpy as np
    from PIL import Image

    height = max(r.shape[1] for r in rows)
    lines = [np.concatenate(list(r), axis=1) for r in rows]
    width = max(line.shape[1] for line in lines)
    sheet = np.full((height * len(lines), width, 3), 255, dtype=np.uint8)
    for i, line in enumerate(lines):
        sheet[i * height : i * height + line.shape[0], : line.shape[1]] = line
    image = Image.fromarray(sheet)
    image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST).save(path)
