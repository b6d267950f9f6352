"""The extract stage's cache of frozen-encoder outputs, shared by every pack that has one.

Outputs are computed once per *content key* (a hash of the encoder's input: an image's
patches, a clip's mel frames, a caption with the text length and the checkpoint's
fingerprint), so what repeats in a dataset is encoded once. They are stored in safetensors
chunks of ``chunk_items`` outputs, each written whole and renamed into place: a killed extract
reopened on the same folder keeps every finished chunk and encodes only what is missing.
Each preprocessed sample keeps references: field name -> the keys whose outputs, joined along
their first axis, replace that field at training time (:class:`CachedSamples`).

Layout: ``chunk-00000.safetensors`` ... and ``index.json`` (``format``, ``files``: key -> chunk,
``samples``: per-sample references, plus what the stage adds, e.g. which towers were frozen).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mmcore.errors import StageError
from mmcore.framework.faults import crash_point
from mmcore.framework.files import atomic_write_json, fsync_dir, fsync_file

FORMAT = 2
CHUNK_GLOB = "chunk-*.safetensors"


class FeatureCacheWriter:
    """Writes a feature cache; reopened on a folder a killed run left, it resumes.

    ``encoded`` and ``reused`` count the outputs computed by this writer and those found
    (earlier in the data, or in chunks a killed run finished)."""

    def __init__(self, folder: Path, chunk_items: int = 16) -> None:
        from safetensors import safe_open

        self.folder = folder
        self.chunk_items = chunk_items
        folder.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, str] = {}
        for chunk in sorted(folder.glob(CHUNK_GLOB)):
            with safe_open(str(chunk), "pt") as handle:
                self.files.update(dict.fromkeys(handle.keys(), chunk.name))
        for partial in [*folder.glob(".chunk-*.tmp"), *folder.glob(".index.json.*.tmp")]:
            partial.unlink()  # a chunk (or index) a kill interrupted mid-write: recomputed
        self.chunks = len(list(folder.glob(CHUNK_GLOB)))
        self.pending: dict[str, Any] = {}
        self.samples: list[dict[str, list[str]]] = []
        self.encoded = self.reused = 0

    def add(self, key: str, compute: Callable[[], Any]) -> str:
        """``key``, computing and storing ``compute()`` (float32, no grad) the first time it is seen."""
        import torch

        if key in self.files or key in self.pending:
            self.reused += 1
            return key
        with torch.no_grad():
            self.pending[key] = compute().float().contiguous()
        self.encoded += 1
        if len(self.pending) >= self.chunk_items:
            self._flush()
        return key

    def add_sample(self, refs: dict[str, list[str]]) -> None:
        """The references of the next preprocessed sample (in dataset order)."""
        self.samples.append(refs)

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        name = f"chunk-{self.chunks:05d}.safetensors"
        partial = self.folder / f".{name}.tmp"
        save_file(self.pending, str(partial))
        fsync_file(partial)
        partial.replace(self.folder / name)
        fsync_dir(self.folder)
        self.files.update(dict.fromkeys(self.pending, name))
        self.pending = {}
        self.chunks += 1
        crash_point("extract-chunk", self.chunks)

    def close(self, **extra: Any) -> int:
        """Write the last chunk and the index; returns how many unique outputs the cache holds."""
        self._flush()
        atomic_write_json(self.folder / "index.json", {"format": FORMAT, "files": self.files, "samples": self.samples, **extra})
        return len(self.files)


class FeatureCache:
    """A finished cache: ``get(key)`` and the index's extra values (``index``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        try:
            self.index = json.loads((folder / "index.json").read_text())
        except (OSError, ValueError) as exc:
            raise StageError(f"feature cache {folder}: unreadable index ({exc}); rerun extract with --force") from None
        if self.index.get("format") != FORMAT:
            raise StageError(f"feature cache {folder} was written by an older mmcore; rerun extract with --force")
        self._handles: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        from mmcore.data.shards import ShardFile  # read by offset, not mapped: see ShardFile

        name = self.index["files"][key]
        if name not in self._handles:
            self._handles[name] = ShardFile(self.folder / name)
        return self._handles[name].tensor(key)

    def refs(self, sample: int) -> dict[str, list[str]]:
        return self.index["samples"][sample]


class CachedSamples:
    """A preprocessed dataset (or a split of it) whose referenced fields come from the cache.

    Args:
        data: the preprocessed samples (``ShardDataset``, possibly a subset).
        cache: the folder a :class:`FeatureCacheWriter` wrote.
        replaces: cached field -> the input field it stands in for, removed from the sample
            (``{"audio_states": "input_features"}``: the mel frames the tower would have read);
            a cached field named like an input field replaces it in place.
    """

    def __init__(self, data: Any, cache: Path, replaces: dict[str, str] | None = None) -> None:
        self.data = data
        self.cache = FeatureCache(cache)
        self.index = self.cache.index
        self.replaces = replaces or {}

    def __len__(self) -> int:
        return len(self.data)

    def meta(self, i: int) -> dict[str, Any]:
        return self.data.meta(i)

    def length(self, i: int) -> int:
        return self.data.length(i)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        sample = dict(self.data[i])
        for name, keys in self.cache.refs(self.data.indices[i]).items():
            if name in self.replaces:
                sample.pop(self.replaces[name], None)
            sample[name] = torch.cat([self.cache.get(k) for k in keys]) if len(keys) > 1 else self.cache.get(keys[0])
        return sample


__all__ = ["FeatureCacheWriter", "FeatureCache", "CachedSamples"]
