"""Download and convert: a local folder in the public layout converts with ``convert.verify``
(bit-identical both ways); a broken folder stops download (in process) with one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mmcore.testing import stage_manifest


def test_download_and_convert_of_a_public_layout_folder_are_bit_identical(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.testing import make_runner, plugins_with

    runner = make_runner(plugins_with(installed_packs=True), "cosyvoice3", tmp_path / "r", preset="tiny", overrides=[f"model.source={tiny_dir}", "convert.verify=true"])
    runner.run_stage("download")
    runner.run_stage("convert")
    convert = stage_manifest(tmp_path / "r", "convert")
    assert convert["metrics"]["verified"] is True
    assert any("bit-identical for every tensor" in note for note in convert["notes"])
    assert (tmp_path / "r/convert/dcp").is_dir() and not (tmp_path / "r/convert/safetensors").exists()


def test_download_refuses_a_folder_without_flow_pt_in_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    from mmcore.testing import make_runner, plugins_with

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "flow.pt").unlink()
    runner = make_runner(plugins_with(installed_packs=True), "cosyvoice3", tmp_path / "r", preset="tiny", overrides=[f"model.source={broken}"])
    with pytest.raises(Exception) as info:
        runner.run_stage("download")
    message = str(info.value)
    assert "\n" not in message and f"{broken}/flow.pt: missing" in message, message
