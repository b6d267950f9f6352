"""The stages the pack declares so far: ``mmcore run`` (as a user runs it) downloads a local folder
in the public layout and converts it with ``convert.verify`` on mmcore's own engines, the rest
skipped visibly; a folder without weights stops download with one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mmcore.testing import stage_manifest


def test_run_downloads_and_converts_a_public_layout_folder_bit_identically(mmcore_cli, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mmcore_cli("run", "--pack", "qwen3tts", "--model", str(tiny_dir), "--run-dir", "r", "convert.verify=true")
    assert "verified: the round trip to mmcore and back is bit-identical for every tensor" in proc.stdout
    assert "key coverage: the 61 tensors of the training model, no more, shapes equal" in proc.stdout
    for stage in ("preprocess", "train", "export", "evaluate"):
        assert f"[{stage}] skipped: the qwen3tts pack has no {stage} stage" in proc.stdout
    assert stage_manifest(tmp_path / "r", "convert")["metrics"]["verified"] is True
    assert (tmp_path / "r/convert/dcp").is_dir()


def test_download_refuses_a_folder_without_weights_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.testing import make_runner, plugins_with

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").unlink()
    runner = make_runner(plugins_with(installed_packs=True), "qwen3tts", tmp_path / "r", preset="tiny", overrides=[f"model.source={broken}"])
    with pytest.raises(Exception) as info:
        runner.run_stage("download")
    message = str(info.value)
    assert "\n" not in message and f"{broken}: no model.safetensors (the talker's weights) at the top of the folder" in message, message
