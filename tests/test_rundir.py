"""Crash-safe writes, content hashes and manifests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mmcore.framework.files import atomic_write_bytes, sha256_tree
from mmcore.run.rundir import Manifest, RunDir, changed_inputs, hash_inputs, missing_outputs


def test_atomic_write_keeps_the_old_content_when_writing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "manifest.json"
    atomic_write_bytes(target, b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temporary left behind


def test_tree_hash_sees_content_and_names_but_not_order_of_creation(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root, order in ((a, ["x", "y"]), (b, ["y", "x"])):
        (root / "sub").mkdir(parents=True)
        for name in order:
            (root / "sub" / name).write_text(name)
    assert sha256_tree(a) == sha256_tree(b)
    (b / "sub" / "x").write_text("changed")
    assert sha256_tree(a) != sha256_tree(b)
    (b / "sub" / "x").write_text("x")
    (b / "sub" / "x").rename(b / "sub" / "z")
    assert sha256_tree(a) != sha256_tree(b)


def test_changed_inputs_ignores_a_touch_but_sees_an_edit(tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text("[1, 2]")
    manifest = Manifest(pack="p", stage="preprocess", status="finished", plan="x", fingerprint="y", inputs=hash_inputs([str(data)]))
    assert changed_inputs(manifest) == []
    os.utime(data, ns=(1, 1))  # same content, new mtime: rehashed, still unchanged
    assert changed_inputs(manifest) == []
    data.write_text("[1, 3]")
    assert changed_inputs(manifest) == [str(data)]
    data.unlink()
    assert changed_inputs(manifest) == [str(data)]


def test_manifest_round_trip_and_outputs(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    (tmp_path / "convert").mkdir()
    (tmp_path / "convert" / "dcp").mkdir()
    m = Manifest(pack="p", stage="convert", status="finished", plan="a", fingerprint="b", outputs={"checkpoint": "dcp", "gone": "nothing"}, started_at=1.0, finished_at=3.5)
    rd.write_manifest(m)
    back = rd.read_manifest("convert")
    assert back is not None and back.to_json() == m.to_json() and back.duration_s == 2.5
    assert back.output("checkpoint") == tmp_path / "convert" / "dcp"
    assert missing_outputs(back) == ["gone"]


def test_hand_edited_manifest_counts_as_unfinished(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "manifest.json").write_text("{not json")
    assert RunDir(tmp_path).read_manifest("train") is None
    assert "unreadable manifest" in capsys.readouterr().out


def test_output_hashes_find_truncation_and_tampering_but_not_a_touch(tmp_path: Path) -> None:
    import os

    from mmcore.run.rundir import Manifest, hash_outputs, output_problems

    stage = tmp_path / "convert"
    (stage / "dcp").mkdir(parents=True)
    (stage / "dcp" / ".metadata").write_bytes(b"m" * 100)
    (stage / "dcp" / "big.distcp").write_bytes(b"w" * (2 << 20))
    manifest = Manifest(pack="p", stage="convert", status="finished", plan="", fingerprint="", outputs={"checkpoint": "dcp"}, stage_dir=stage)
    manifest.output_files = hash_outputs(manifest)
    assert set(manifest.output_files["checkpoint"]) == {".metadata", "big.distcp"}
    os.utime(stage / "dcp" / ".metadata")
    assert output_problems(manifest) == []
    (stage / "dcp" / ".metadata").write_bytes(b"M" * 100)  # same size, other bytes: a small file is hashed
    assert output_problems(manifest) == [f"{stage / 'dcp' / '.metadata'}: content changed since stage 'convert' finished"]
    (stage / "dcp" / ".metadata").write_bytes(b"m" * 100)
    with open(stage / "dcp" / "big.distcp", "r+b") as handle:
        handle.write(b"X")  # a large file is hashed only by the full check
    assert output_problems(manifest) == [] and len(output_problems(manifest, full=True)) == 1
    (stage / "dcp" / "big.distcp").write_bytes(b"w" * 10)
    assert output_problems(manifest) == [f"{stage / 'dcp' / 'big.distcp'}: 10 bytes, {2 << 20} when stage 'convert' finished"]


def test_hub_hashes_are_compared_for_lfs_files(tmp_path: Path) -> None:
    from huggingface_hub.hf_api import BlobLfsInfo, RepoSibling

    from mmcore.engines.download import hub_hash_mismatches

    local = {"model.safetensors": "a" * 64, "config.json": "c" * 64}
    siblings = [RepoSibling("model.safetensors", lfs=BlobLfsInfo(size=1, sha256="a" * 64, pointer_size=1)), RepoSibling("config.json")]
    assert hub_hash_mismatches(local, siblings) == []
    siblings[0] = RepoSibling("model.safetensors", lfs=BlobLfsInfo(size=1, sha256="b" * 64, pointer_size=1))
    assert hub_hash_mismatches(local, siblings) == ["model.safetensors"]


def test_trust_remote_code_reaches_the_loaders_only_when_the_run_asks(tmp_path: Path) -> None:
    from mmcore import PackSpec, StageResult, hookimpl
    from mmcore.engines.download import remote_code
    from mmcore.testing import make_runner, plugins_with

    class Loads:
        PACK = PackSpec(name="loads")

        @hookimpl
        def mmcore_download(self, ctx):
            return StageResult(outputs={"model": "."}, metrics=remote_code())

    plugins = plugins_with(Loads())
    assert make_runner(plugins, "loads", tmp_path / "a").run_stage("download").metrics == {"trust_remote_code": False}
    opted = make_runner(plugins, "loads", tmp_path / "b", overrides=["model.trust_remote_code=true"])
    assert opted.run_stage("download").metrics == {"trust_remote_code": True}
