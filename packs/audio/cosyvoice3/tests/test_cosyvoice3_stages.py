"""The stages the pack declares so far, run as a user runs them: ``mmcore run`` downloads (a local
folder in the public layout) and converts with ``convert.verify``; the rest is skipped, visibly."""

from __future__ import annotations

import shutil
from pathlib import Path

from mmcore.testing import stage_manifest


def test_run_downloads_and_converts_a_public_layout_folder_bit_identically(mmcore_cli, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = mmcore_cli("run", "--pack", "cosyvoice3", "--model", str(tiny_dir), "--run-dir", "r", "convert.verify=true")
    assert "verified: .pt -> DCP -> safetensors -> .pt is bit-identical for every tensor" in proc.stdout
    for stage in ("preprocess", "train", "export", "evaluate"):
        assert f"[{stage}] skipped: the cosyvoice3 pack has no {stage} stage" in proc.stdout
    convert = stage_manifest(tmp_path / "r", "convert")
    assert convert["metrics"]["verified"] is True
    assert (tmp_path / "r/convert/dcp").is_dir() and not (tmp_path / "r/convert/safetensors").exists()


def test_download_refuses_a_folder_without_flow_pt_in_one_line(mmcore_cli, tiny_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "flow.pt").unlink()
    proc = mmcore_cli("download", "--pack", "cosyvoice3", "--model", str(broken), "--run-dir", "r", check=False)
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "flow.pt: missing" in line]
    assert errors and str(broken) in errors[0], proc.stdout + proc.stderr
