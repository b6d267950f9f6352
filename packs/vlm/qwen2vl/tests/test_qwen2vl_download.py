"""Download: init presets, local folders (hashed, so edits rerun the pipeline), hub ids offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def test_local_directory_is_used_in_place_and_hashed(mm, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    local = tmp_path / "my-model"
    shutil.copytree(tiny_dir, local)
    mm("convert", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r", check=False)
    mm("download", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r")
    manifest = json.loads((tmp_path / "r/download/manifest.json").read_text())
    assert manifest["outputs"]["model"] == str(local) and str(local) in manifest["inputs"]
    proc = mm("download", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r")
    assert "up to date" in proc.stdout
    config = json.loads((local / "config.json").read_text())
    config["text_config"]["rms_norm_eps"] = 1e-5
    (local / "config.json").write_text(json.dumps(config))
    proc = mm("download", "--pack", "qwen2vl", "--preset", "tiny", "--model", str(local), "--run-dir", "r")
    assert f"input changed: {local}" in proc.stdout


def test_hub_id_offline_without_cache_is_one_clear_line(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mm("download", "--pack", "qwen2vl", "--model", "Qwen/Qwen2-VL-2B-Instruct", "--offline", check=False, HF_HOME=str(tmp_path / "empty-hf-home"), HF_HUB_OFFLINE="1")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: Qwen/Qwen2-VL-2B-Instruct: not in the local hub cache and offline mode is on "
        "(hint: download it once online, or point --model at a local directory)"
    )


def test_bad_sources_are_named(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "empty").mkdir()
    proc = mm("download", "--pack", "qwen2vl", "--model", str(tmp_path / "empty"), check=False)
    assert proc.returncode == 1 and "no .safetensors files in the model directory" in proc.stderr
    proc = mm("download", "--pack", "qwen2vl", "--model", "init:huge", check=False)
    assert proc.returncode == 1 and "init:huge: unknown tiny preset; choose one of tiny, tiny-2.5, demo" in proc.stderr
    proc = mm("download", "--pack", "qwen2vl", "--model", "not a model", check=False)
    assert "neither an existing directory, init:<preset>, nor a hub id" in proc.stderr
