"""Fixtures of the qwen2vl pack's tests: tiny checkpoints and real media files, made offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qwen2vl_media import write_image, write_video


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
        {"messages": [{"role": "user", "content": "<image>Who are they?"}, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "And now?<image>"}, {"role": "assistant", "content": "Blue."}], "images": ["imgs/a.jpg", "imgs/b.png"]},
        {"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "A bar grows."}], "videos": ["clips/v.mp4"]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "red vs blue"}], "images": ["imgs/a.jpg", "imgs/b.png"]},
    ]
    (root / "data.json").write_text(json.dumps(records))
    sharegpt = [{"conversations": [{"from": "human", "value": "<image>Colour?"}, {"from": "gpt", "value": "red"}], "images": ["imgs/a.jpg"]}]
    (root / "sharegpt.json").write_text(json.dumps(sharegpt))
    return root


class PackCLI:
    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def __call__(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
        full_env.update(env)
        proc = subprocess.run([sys.executable, "-m", "mmcore", *args], cwd=self.cwd, env=full_env, capture_output=True, text=True, timeout=600)
        if check and proc.returncode != 0:
            raise AssertionError(f"mmcore {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc


@pytest.fixture
def mm(tmp_path: Path) -> PackCLI:
    return PackCLI(tmp_path)
