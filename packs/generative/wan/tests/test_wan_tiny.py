"""init:<preset> must give the same files every time: runs in two directories are compared."""

from __future__ import annotations

from pathlib import Path

from mm_pack_wan.tiny import build_init_checkpoint


def test_two_builds_of_a_preset_are_identical(tmp_path: Path) -> None:
    build_init_checkpoint("tiny", tmp_path / "a", seed=0)
    build_init_checkpoint("tiny", tmp_path / "b", seed=0)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and any(f.name == "tokenizer.json" for f in files)
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
