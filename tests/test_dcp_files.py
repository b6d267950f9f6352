"""DCP files written and read without torch (:mod:`mmcore.checkpoint.dcp_files`), checked
against torch: its archives, its ``dcp.load`` and what its own writer writes."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
import torch.utils.serialization
from safetensors.torch import save_file

from mmcore.checkpoint import dcp_files
from mmcore.checkpoint.safetensors_files import compare_hf
from mmcore.engines import convert_bytes
from mmcore.engines.state_dict import RenameAdapter
from mmcore.framework.direct_write import DirectFile

SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (0, 4), (1, 1, 1, 2, 3), (70000,)]
CODES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool, "F64": torch.float64}
ADAPTER = RenameAdapter(rules=[(r"^model\.(.*)$", r"inner.\1", r"^inner\.(.*)$", r"model.\1")], tied=["lm_head.weight"])


def _serialization_id_blanked(raw: bytes) -> bytes:
    return re.sub(rb"(\.data/serialization_id(?:FB..)?Z*)\d{40}", rb"\1" + b"0" * 40, raw, flags=re.S)


def _random(code: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    dtype = CODES[code]
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    return torch.randint(0, 100, shape, generator=gen).to(dtype)


@pytest.mark.parametrize("code", sorted(CODES))
def test_archives_are_torch_saves_bytes_but_for_the_serialization_id(tmp_path: Path, code: str) -> None:
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        tensor = _random(code, shape, gen)
        ours = io.BytesIO()
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        (tmp_path / "src").write_bytes(raw)
        with open(tmp_path / "src", "rb") as src:
            dcp_files.write_tensor_file(tmp_path / "t.distcp", code, shape, src, 0, len(raw))
        ours = (tmp_path / "t.distcp").read_bytes()
        theirs = io.BytesIO()
        with torch.utils.serialization.config.patch({"save.compute_crc32": False}):
            torch.save(tensor, theirs)
        assert _serialization_id_blanked(ours) == _serialization_id_blanked(theirs.getvalue()), (code, shape)
        loaded = torch.load(tmp_path / "t.distcp", weights_only=True)
        assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape and torch.equal(loaded, tensor)


def _hub(folder: Path) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    tensors = {f"model.layer{i}.{code.lower()}": _random(code, shape, gen) for i, (code, shape) in enumerate(zip(sorted(CODES) * 2, SHAPES * 2))}
    folder.mkdir()
    keys = sorted(tensors)
    save_file({k: tensors[k] for k in keys[:7]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in keys[7:]}, str(folder / "model-00002-of-00002.safetensors"))
    return tensors


def test_a_renamed_conversion_loads_through_torch_bit_for_bit_and_reads_back_torchs_own(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from mmcore.checkpoint import safe_dcp
    from mmcore.engines import convert

    tensors = _hub(tmp_path / "hf")
    stats = convert_bytes.hf_to_dcp(tmp_path / "hf", tmp_path / "dcp", ADAPTER)
    assert stats is not None and stats["tensors"] == len(tensors)
    wanted = {"model.inner." + k.removeprefix("model."): torch.empty(v.shape, dtype=v.dtype) for k, v in tensors.items()}
    safe_dcp.load(wanted, tmp_path / "dcp")  # torch's reader, through mmcore's guarded planner
    for key, value in tensors.items():
        got = wanted["model.inner." + key.removeprefix("model.")]
        assert got.dtype == value.dtype and torch.equal(got, value), key
    # the metadata torch unpickles equals what its own writer records for these tensors
    ours = safe_dcp.read_metadata(tmp_path / "dcp")
    theirs_dir = tmp_path / "torch-dcp"
    dcp.save({k: v.clone() for k, v in wanted.items()}, storage_writer=FileSystemWriter(str(theirs_dir), single_file_per_rank=False, sync_files=False), no_dist=True)
    theirs = safe_dcp.read_metadata(theirs_dir)
    assert ours.state_dict_metadata == theirs.state_dict_metadata and ours.planner_data == theirs.planner_data
    assert sorted(i.fqn for i in ours.storage_data) == sorted(i.fqn for i in theirs.storage_data)
    # back to HF without torch, from ours and from torch's: the source's tensors, bit for bit
    for source in ("dcp", "torch-dcp"):
        stats = convert_bytes.dcp_to_hf(tmp_path / source, tmp_path / f"back-{source}", ADAPTER, max_shard_bytes=1 << 16)
        assert stats is not None and stats["shards"] > 1
        assert compare_hf(tmp_path / "hf", tmp_path / f"back-{source}") == []
    # the torch path writes the same files
    torch_back = tmp_path / "torch-back"
    original = convert_bytes.dcp_to_hf
    try:
        convert_bytes.dcp_to_hf = lambda *a, **k: None  # type: ignore[assignment]
        convert.dcp_to_hf(tmp_path / "dcp", torch_back, ADAPTER, max_shard_bytes=1 << 16)
    finally:
        convert_bytes.dcp_to_hf = original  # type: ignore[assignment]
    assert sorted(p.name for p in torch_back.iterdir()) == sorted(p.name for p in (tmp_path / "back-dcp").iterdir())
    for path in torch_back.iterdir():
        assert path.read_bytes() == (tmp_path / "back-dcp" / path.name).read_bytes(), path.name


def test_what_the_byte_path_does_not_cover_goes_to_torch(tmp_path: Path) -> None:
    from mmcore.engines.state_dict import FusedExpertsAdapter

    _hub(tmp_path / "hf")
    assert convert_bytes.hf_to_dcp(tmp_path / "hf", tmp_path / "x", FusedExpertsAdapter()) is None
    convert_bytes.hf_to_dcp(tmp_path / "hf", tmp_path / "dcp", ADAPTER)
    assert convert_bytes.dcp_to_hf(tmp_path / "dcp", tmp_path / "y", ADAPTER, max_shard_bytes=1 << 30, dtype=torch.bfloat16) is None


def test_a_planted_global_in_the_metadata_is_refused(tmp_path: Path) -> None:
    import pickle

    from mmcore.errors import StageError

    (tmp_path / ".metadata").write_bytes(pickle.dumps(print))
    with pytest.raises(StageError, match="refused to read: it references builtins.print"):
        dcp_files.read_metadata(tmp_path)


def test_a_tree_of_many_files_is_flushed_by_one_syncfs_and_a_few_files_one_by_one(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A converted checkpoint (one file per tensor) is made durable by one syncfs of its file
    system on Linux (fsyncing 106 files one by one cost more than the copy: bench/convert_speed.py);
    a folder of a few files, or a system without syncfs, is fsynced file by file."""
    import os
    import sys

    from mmcore.framework import files

    fsynced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd))[1])
    for n in range(20):
        (tmp_path / "many" / "sub").mkdir(parents=True, exist_ok=True)
        (tmp_path / "many" / "sub" / f"{n}.bin").write_bytes(b"x" * n)
    files.fsync_tree(tmp_path / "many")
    if sys.platform.startswith("linux"):
        assert fsynced == []  # one syncfs instead
    (tmp_path / "few").mkdir()
    for n in range(3):
        (tmp_path / "few" / f"{n}.bin").write_bytes(b"y")
    fsynced.clear()
    files.fsync_tree(tmp_path / "few")
    assert len(fsynced) == 4  # three files and the folder
    monkeypatch.setattr(files, "_syncfs", lambda folder: False)
    fsynced.clear()
    files.fsync_tree(tmp_path / "many")
    assert len(fsynced) == 20 + 1  # the files and the top folder (as before syncfs)


def test_shards_copied_on_threads_fail_together_and_leave_no_shard(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """DCP -> HF copies its shards on threads (``COPY_THREADS``): a copy that fails (here the disk
    full at the third tensor) raises its error once the other shards' copies stopped, and no
    shard, whole or partial, is left under any name."""
    import errno

    _hub(tmp_path / "hf")
    convert_bytes.hf_to_dcp(tmp_path / "hf", tmp_path / "dcp", ADAPTER)
    real_copy, calls = DirectFile.copy_from, []

    def copy_until_full(self, *args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_copy(self, *args)

    monkeypatch.setattr(DirectFile, "copy_from", copy_until_full)
    monkeypatch.setattr(convert_bytes, "COPY_THREADS", 2)
    with pytest.raises(OSError, match="No space left"):
        convert_bytes.dcp_to_hf(tmp_path / "dcp", tmp_path / "back", ADAPTER, max_shard_bytes=1 << 16)
    assert list((tmp_path / "back").iterdir()) == []
    assert convert_bytes.in_parallel([lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]  # results in the jobs' order
