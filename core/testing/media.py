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
        {"messages": [{"role": "user", "content": "<image>Who?"}, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "And <image>?"}, {"role": "assistant", "content": "Blue."}], "images": ["imgs/a.jpg", "imgs/b.png"]},
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
        {"messages": [{"role": "user", "content": "<image><audio>What do you see and hear?"}, {"role": "assistant", "content": "red, a tone"},
                      {"role": "user", "content": "And here?<video><audio>"}, {"role": "assistant", "content": "a bar, a higher tone"}],
         "images": ["imgs/a.jpg"], "videos": ["clips/v.mp4"], "audios": ["sounds/a.wav", "sounds/b.mp3"]},
        {"messages": [{"role": "user", "content": "<audio>Describe the sound."}, {"role": "assistant", "content": "low"}], "audios": ["sounds/c.flac"]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "red vs blue"}], "images": ["imgs/a.jpg", "imgs/b.png"]},
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    return root / "data.json"
