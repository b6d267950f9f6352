"""Fixtures of the qwen2vl pack's tests: tiny checkpoints and real media files, made offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmcore.testing.media import write_image, write_video


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("tiny") / "model"
    build_init_checkpoint("tiny", out, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny25_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mm_pack_qwen2vl.tiny import build_init_checkpoint

    out = tmp_path_factory.mktemp("tiny25") / "model"
    build_init_checkpoint("tiny-2.5", out, seed=0)
    return out


@pytest.fixture
def wild_dataset(tmp_path: Path) -> Path:
    """MLLM JSON as found in the wild: multi-turn, two images, a video, text only, a system prompt."""
    root = tmp_path / "wild"
    write_image(root / "imgs/a.jpg", (255, 0, 0))
    write_image(root / "imgs/b.png", (0, 0, 255), size=(40, 90))
    write_video(root / "clips/v.mp4")
    records = [
        {
            "messages": [
                {"role": "user", "content": "<image>Who are they?"},
                {"role": "assistant", "content": "Red."},
                {"role": "user", "content": "And now?<image>"},
                {"role": "assistant", "content": "Blue."},
            ],
            "images": ["imgs/a.jpg", "imgs/b.png"],
        },
        {"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "A bar grows."}], "videos": ["clips/v.mp4"]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "red vs blue"}], "images": ["imgs/a.jpg", "imgs/b.png"]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    sharegpt = [{"conversations": [{"from": "human", "value": "<image>Colour?"}, {"from": "gpt", "value": "red"}], "images": ["imgs/a.jpg"]}]
    (root / "sharegpt.json").write_text(json.dumps(sharegpt))
    return root


@pytest.fixture
def mm(mmcore_cli):  # type: ignore[no-untyped-def]
    return mmcore_cli
