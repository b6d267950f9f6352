"""Fixtures of the wan pack's tests: a CLI runner in a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


class WanCLI:
    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def __call__(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MMCORE_")}
        full_env.update(env)
        proc = subprocess.run([sys.executable, "-m", "mmcore", *args], cwd=self.cwd, env=full_env, capture_output=True, text=True, timeout=900)
        if check and proc.returncode != 0:
            raise AssertionError(f"mmcore {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc


@pytest.fixture
def wan(tmp_path: Path) -> WanCLI:
    return WanCLI(tmp_path)
