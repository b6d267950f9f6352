"""Real media files for tests, made offline: PIL images, PyAV-encoded H.264 video, audio tones."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_image(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def write_video(path: Path, frames: int = 8, fps: int = 4, size: int = 56) -> None:
    """A bar growing left to right, one step per frame."""
    import numpy as np

    from mmcore.data.video import write_mp4

    video = np.zeros((frames, size, size, 3), dtype=np.uint8)
    for i in range(frames):
        video[i, :, : (i + 1) * size // frames] = (200, 40, 40)
    write_mp4(path, video, fps)


def write_audio(path: Path, seconds: float = 1.0, hz: float = 440.0, rate: int = 16000) -> None:
    """A 16-bit mono wav of a sine tone."""
    from mmcore.data.audio import write_audio as write

    write(path, tone(seconds, hz, rate), rate)


def tone(seconds: float, hz: float = 440.0, rate: int = 16000, amplitude: float = 0.4) -> Any:
    """A sine of ``seconds`` at ``rate`` samples per second (numpy float64)."""
    import numpy as np

    return amplitude * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)


def write_wild_mllm(root: Path) -> Path:
    """LLaMA-Factory's MLLM JSON as found in the wild, written with its media under ``root``:
    a multi-turn sample with two images, a video, a text-only sample with a system prompt, and
    (sample 3) one whose image ``imgs/missing.jpg`` does not exist. Returns the JSON file."""
    import json

    write_image(root / "imgs/a.jpg", (255, 0, 0))
    write_image(root / "imgs/b.png", (0, 0, 255), size=(40, 90))
    write_video(root / "clips/v.mp4")
    records = [
        {
            "messages": [{"role": "user", "content": "<image>Who?"}, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "And <image>?"}, {"role": "assistant", "content": "Blue."}],
            "images": ["imgs/a.jpg", "imgs/b.png"],
        },
        {"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "A bar grows."}], "videos": ["clips/v.mp4"]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "<image>Colour?"}, {"role": "assistant", "content": "red"}], "images": ["imgs/missing.jpg"]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    return root / "data.json"


def write_wild_omni(root: Path) -> Path:
    """MLLM JSON for omni models as found in the wild, written with its media under ``root``:
    audio (wav, mp3 at 22.05 kHz, flac at 44.1 kHz), images and a video mixed in one multi-turn
    conversation, an audio-only sample, a two-image sample with a system prompt, text only.
    Returns the JSON file."""
    import json

    from mmcore.data.audio import write_audio as write_clip

    write_image(root / "imgs/a.jpg", (255, 0, 0))
    write_image(root / "imgs/b.png", (0, 0, 255), size=(40, 90))
    write_video(root / "clips/v.mp4")
    write_clip(root / "sounds/a.wav", tone(0.7), 16000)
    write_clip(root / "sounds/b.mp3", tone(1.3, 660, 22050), 22050)
    write_clip(root / "sounds/c.flac", tone(0.4, 220, 44100), 44100)
    records = [
        {
            "messages": [
                {"role": "user", "content": "<image><audio>What do you see and hear?"},
                {"role": "assistant", "content": "red, a tone"},
                {"role": "user", "content": "And here?<video><audio>"},
                {"role": "assistant", "content": "a bar, a higher tone"},
            ],
            "images": ["imgs/a.jpg"],
            "videos": ["clips/v.mp4"],
            "audios": ["sounds/a.wav", "sounds/b.mp3"],
        },
        {"messages": [{"role": "user", "content": "<audio>Describe the sound."}, {"role": "assistant", "content": "low"}], "audios": ["sounds/c.flac"]},
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "red vs blue"}],
            "images": ["imgs/a.jpg", "imgs/b.png"],
        },
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    return root / "data.json"


def write_mixed_mllm(root: Path, kinds: tuple[str, ...] = ("image",), each: int | None = None) -> Path:
    """MLLM JSON as real SFT data mixes it, with its media under ``root``: text-only samples
    beside samples with one item of each of ``kinds`` (``image``, ``video``, ``audio``), two
    images of different sizes, and (with audio and image) both in one turn; sizes and answers
    vary. Each shape of sample comes ``each`` times (default 5 where there are at most three
    shapes, else 3): odd counts, so any split of the samples across ranks puts different media
    side by side. Returns the JSON file."""
    import json

    colours = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 220)}
    shapes = ["text"] + [k for k in ("image", "video", "audio") if k in kinds]
    if "image" in kinds:
        shapes.append("images")
    if "image" in kinds and "audio" in kinds:
        shapes.append("image+audio")
    records = []
    for i in range(len(shapes) * (each or (5 if len(shapes) <= 3 else 3))):
        shape, (name, rgb) = shapes[i % len(shapes)], list(colours.items())[i % len(colours)]
        record: dict[str, Any] = {}
        if shape == "text":
            prompt = f"Say {name}{', please' * (i % 3)}."
        elif shape == "image":
            write_image(root / f"imgs/{i}.png", rgb, size=(48 + 8 * (i % 3), 48))
            prompt, record["images"] = "<image>What colour?", [f"imgs/{i}.png"]
        elif shape == "images":
            write_image(root / f"imgs/{i}a.png", rgb)
            write_image(root / f"imgs/{i}b.png", rgb, size=(40, 64))
            prompt, record["images"] = "Compare <image> and <image>.", [f"imgs/{i}a.png", f"imgs/{i}b.png"]
        elif shape == "video":
            write_video(root / f"clips/{i}.mp4", frames=4 + 4 * (i % 2))
            prompt, record["videos"] = "<video>What happens?", [f"clips/{i}.mp4"]
        elif shape == "audio":
            write_audio(root / f"sounds/{i}.wav", seconds=0.4 + 0.2 * (i % 3), hz=300 + 100 * (i % 3))
            prompt, record["audios"] = "<audio>Which pitch?", [f"sounds/{i}.wav"]
        else:
            write_image(root / f"imgs/{i}.png", rgb)
            write_audio(root / f"sounds/{i}.wav", seconds=0.5)
            prompt, record["images"], record["audios"] = "<image><audio>What colour, which pitch?", [f"imgs/{i}.png"], [f"sounds/{i}.wav"]
        records.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": name}], **record})
    (root / "data.json").write_text(json.dumps(records))
    return root / "data.json"


def write_noise(path: Path, size: tuple[int, int], seed: int) -> None:
    """A random-pixel RGB picture of ``size`` (width, height): no two patches alike, so a
    vision tower's features differ everywhere (a flat colour would hide mixed-up patches)."""
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)


def write_wild_image_mllm(root: Path, *extra: dict[str, Any]) -> Path:
    """LLaMA-Factory's MLLM JSON for image-only families as written in the wild, media under
    ``root`` and paths relative to the file: a multi-turn sample with two images (a wide
    220x120 and a small 64x40), a text-only sample with a system prompt, a one-image sample,
    another text-only sample, then ``extra`` records as given. Returns the JSON file."""
    import json

    write_noise(root / "imgs/page.png", (220, 120), 3)
    write_noise(root / "imgs/word.jpg", (64, 40), 4)
    records = [
        {
            "messages": [
                {"role": "user", "content": "<image>What colour is the square?"},
                {"role": "assistant", "content": "red"},
                {"role": "user", "content": "And <image>?"},
                {"role": "assistant", "content": "blue"},
            ],
            "images": ["imgs/page.png", "imgs/word.jpg"],
        },
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "<image>Describe the image."}, {"role": "assistant", "content": "green"}], "images": ["imgs/word.jpg"]},
        {"messages": [{"role": "user", "content": "What colour is the square?"}, {"role": "assistant", "content": "yellow"}]},
        *extra,
    ]
    (root / "data.json").write_text(json.dumps(records))
    return root / "data.json"


#: the colours :func:`write_captioned_pictures` draws
PICTURE_COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


def write_captioned_pictures(root: Path) -> Path:
    """Text-to-picture samples in LLaMA-Factory's MLLM JSON: eight 32x32 pictures (a square or a
    circle of each :data:`PICTURE_COLOURS` colour on grey), each the assistant's ``<image>`` answer
    to its caption ("a red square"). Returns the JSON file."""
    import json

    from PIL import Image, ImageDraw

    (root / "pics").mkdir(parents=True)
    records = []
    for colour, rgb in PICTURE_COLOURS.items():
        for shape in ("square", "circle"):
            picture = Image.new("RGB", (32, 32), (128, 128, 128))
            draw = ImageDraw.Draw(picture)
            (draw.rectangle if shape == "square" else draw.ellipse)((4, 4, 27, 27), fill=rgb)
            picture.save(root / f"pics/{colour}-{shape}.png")
            messages = [{"role": "user", "content": f"a {colour} {shape}"}, {"role": "assistant", "content": "<image>"}]
            records.append({"messages": messages, "images": [f"pics/{colour}-{shape}.png"]})
    (root / "pictures.json").write_text(json.dumps(records))
    return root / "pictures.json"
