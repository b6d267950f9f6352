"""The feature cache every extract stage writes: content-keyed, chunked, resumable after a kill."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmcore.data.feature_cache import CachedSamples, FeatureCache, FeatureCacheWriter
from mmcore.data.shards import ShardDataset, ShardWriter
from mmcore.errors import StageError


def outputs(n: int) -> dict[str, torch.Tensor]:
    return {f"k{i}": torch.full((2, 3), float(i)) for i in range(n)}


def test_a_writer_reopened_after_a_kill_keeps_finished_chunks_and_encodes_the_rest(tmp_path: Path) -> None:
    items = outputs(10)
    first = FeatureCacheWriter(tmp_path, chunk_items=4)
    for key in list(items)[:6]:
        first.add(key, lambda k=key: items[k])
    # killed here: one chunk of 4 written, 2 outputs pending, and a chunk caught mid-write
    (tmp_path / ".chunk-00001.safetensors.tmp").write_bytes(b"partial")
    (tmp_path / ".index.json.abc123.tmp").write_bytes(b"{")  # and an index caught mid-write
    again = FeatureCacheWriter(tmp_path, chunk_items=4)
    calls = []
    for key in items:
        again.add(key, lambda k=key: calls.append(k) or items[k])
        again.add_sample({"x": [key]})
    assert again.close() == 10
    assert calls == [f"k{i}" for i in range(4, 10)] and again.reused == 4 and again.encoded == 6
    assert not list(tmp_path.glob(".*.tmp"))
    assert all(chunk.stat().st_size > 16 for chunk in tmp_path.glob("chunk-*"))  # no empty chunk
    cache = FeatureCache(tmp_path)
    assert all(torch.equal(cache.get(k), v) for k, v in items.items())


def test_cached_samples_replace_the_field_the_cache_stands_in_for(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "data")
    for i in range(3):
        writer.add({"frames": torch.zeros(4), "ids": torch.tensor([i])}, length=1, meta={})
    writer.close()
    cache = FeatureCacheWriter(tmp_path / "features")
    for i in range(3):
        cache.add_sample({"latents": [cache.add(f"a{i}", lambda i=i: torch.ones(1, 2) * i), cache.add("shared", lambda: torch.zeros(1, 2))]})
    cache.close()
    samples = CachedSamples(ShardDataset(tmp_path / "data"), tmp_path / "features", replaces={"latents": "frames"})
    sample = samples[2]
    assert set(sample) == {"ids", "latents"} and sample["latents"].tolist() == [[2.0, 2.0], [0.0, 0.0]]


def test_a_cache_of_another_format_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"by_key": {}, "samples_media": []}')
    with pytest.raises(StageError, match="written by an older mmcore; rerun extract with --force"):
        FeatureCache(tmp_path)


def test_shard_reads_are_safetensors_tensors_and_rows_pad_as_one_at_a_time(tmp_path: Path) -> None:
    from safetensors import safe_open

    from mmcore.train.causal_lm import IGNORE, padded_rows

    writer = ShardWriter(tmp_path / "data", max_shard_bytes=1 << 10)  # several shards
    gen = torch.Generator().manual_seed(0)
    for n in range(12):
        ids = torch.randint(0, 99, (3 + n % 5,), generator=gen)
        fields = {
            "input_ids": ids,
            "labels": ids.clone(),
            "pixels": torch.randn(n % 3, 4, generator=gen).to(torch.bfloat16),
            "grid": torch.tensor([[1, 2, n]], dtype=torch.int32),
            "keep": torch.tensor([n % 2 == 0]),
        }
        writer.add(fields, length=len(ids))
    writer.close()
    data = ShardDataset(tmp_path / "data")
    for i in range(len(data)):
        record = data.meta(i)
        with safe_open(str(tmp_path / "data" / f"shard-{record['shard']:05d}.safetensors"), framework="pt") as handle:
            expected = {name: handle.get_tensor(f"{data.indices[i]}/{name}") for name in record["fields"]}
        got = data[i]
        assert list(got) == list(expected)
        for name in got:
            assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape and torch.equal(got[name], expected[name]), name
        got["input_ids"].fill_(-1)  # a read is the caller's own memory: writing it leaves the file and the next read alone
        assert torch.equal(data[i]["input_ids"], expected["input_ids"])
    samples = [data[i] for i in range(5)]
    batch = padded_rows(samples, pad_id=7)
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        assert torch.equal(batch["input_ids"][row, :n], sample["input_ids"]) and (batch["input_ids"][row, n:] == 7).all()
        assert torch.equal(batch["labels"][row, :n], sample["labels"]) and (batch["labels"][row, n:] == IGNORE).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)


def test_a_dataset_of_more_shards_than_may_be_open_reads_every_one_right(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Shards are read by offset through descriptors of which a process keeps at most
    MAX_OPEN_SHARDS (a dataset of thousands of shards must not run into the open-file limit):
    reading across more shards than that, in an order that keeps evicting, gives every tensor."""
    from safetensors import safe_open

    from mmcore.data import shards

    monkeypatch.setattr(shards, "MAX_OPEN_SHARDS", 2)
    writer = ShardWriter(tmp_path / "data", max_shard_bytes=64)  # a shard per sample or two
    for n in range(10):
        writer.add({"input_ids": torch.arange(n, n + 20)}, length=20)
    writer.close()
    data = ShardDataset(tmp_path / "data")
    assert data.index["num_shards"] >= 5
    for i in [0, 9, 3, 7, 1, 9, 5, 0, 8, 2, 6, 4]:
        record = data.meta(i)
        with safe_open(str(tmp_path / "data" / f"shard-{record['shard']:05d}.safetensors"), framework="pt") as handle:
            assert torch.equal(data[i]["input_ids"], handle.get_tensor(f"{data.indices[i]}/input_ids")), i
    assert len(shards._OPEN) <= 2
