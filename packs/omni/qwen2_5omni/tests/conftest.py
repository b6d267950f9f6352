"""Fixtures of the qwen2.5omni pack's tests: a tiny thinker and real media files, made offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.testing.media import tone, write_image, write_video


@pytest.fixture(scope="session")
def tiny_omni(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_qwen2_5omni.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("omni") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture
def wild_omni(tmp_path: Path) -> Path:
    """MLLM JSON as found in the wild: audio (wav/mp3/flac), images and a video mixed in one conversation."""
    from mmcore.data.audio import write_audio

    root = tmp_path / "wild"
    write_image(root / "imgs/a.jpg", (255, 0, 0))
    write_image(root / "imgs/b.png", (0, 0, 255), size=(40, 90))
    write_video(root / "clips/v.mp4")
    write_audio(root / "sounds/a.wav", tone(0.7), 16000)
    write_audio(root / "sounds/b.mp3", tone(1.3, 660, 22050), 22050)
    write_audio(root / "sounds/c.flac", tone(0.4, 220, 44100), 44100)
    records = [
        {"messages": [{"role": "user", "content": "<image><audio>What do you see and hear?"}, {"role": "assistant", "content": "red, a tone"},
                      {"role": "user", "content": "And here?<video><audio>"}, {"role": "assistant", "content": "a bar, a higher tone"}],
         "images": ["imgs/a.jpg"], "videos": ["clips/v.mp4"], "audios": ["sounds/a.wav", "sounds/b.mp3"]},
        {"messages": [{"role": "user", "content": "<audio>Describe the sound."}, {"role": "assistant", "content": "low"}], "audios": ["sounds/c.flac"]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "red vs blue"}], "images": ["imgs/a.jpg", "imgs/b.png"]},
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    return root


@pytest.fixture
def omni(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
