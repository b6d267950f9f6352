"""The extract stage's cache of frozen-encoder outputs, shared by every pack that has one.

Outputs are computed once per *content key* (a hash of the encoder's input: an image's
patches, a clip's mel frames), so media repeated in a dataset are encoded once, and stored in
safetensors shards (:class:`~mmcore.data.shards.ShardWriter`). Each preprocessed sample keeps
references: field name -> the keys whose outputs, concatenated, replace that field at
training time (:class:`CachedSamples`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from mmcore.data.shards import ShardDataset, ShardWriter


class FeatureCacheWriter:
    def __init__(self, folder: Path) -> None:
        self.writer = ShardWriter(folder)
        self.by_key: dict[str, int] = {}
        self.samples: list[dict[str, list[str]]] = []

    def add(self, key: str, compute: Callable[[], Any]) -> str:
        """``key``, computing and storing ``compute()`` (float32, no grad) the first time it is seen."""
        import torch

        if key not in self.by_key:
            with torch.no_grad():
                states = compute()
            self.by_key[key] = self.writer.add({"states": states.float()}, length=len(states), meta={"key": key})
        return key

    def add_sample(self, refs: dict[str, list[str]]) -> None:
        """The references of the next preprocessed sample (in dataset order)."""
        self.samples.append(refs)

    def close(self, **extra: Any) -> int:
        """Write the index; returns how many unique items were encoded."""
        self.writer.close(by_key=self.by_key, samples_media=self.samples, **extra)
        return len(self.by_key)


class CachedSamples:
    """A preprocessed dataset (or a split of it) whose referenced fields come from the cache.

    Args:
        data: the preprocessed samples (``ShardDataset``, possibly a subset).
        cache: the folder a :class:`FeatureCacheWriter` wrote.
        replaces: cached field -> the input field it stands in for, removed from the sample
            (``{"audio_states": "input_features"}``: the mel frames the tower would have read);
            a cached field named like an input field replaces it in place.
    """

    def __init__(self, data: ShardDataset, cache: Path, replaces: dict[str, str] | None = None) -> None:
        self.data = data
        self.cache = ShardDataset(cache)
        self.index = self.cache.index
        self.by_key = self.index["by_key"]
        self.refs = self.index["samples_media"]
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
        refs = self.refs[self.data.indices[i]]
        for name, keys in refs.items():
            if name in self.replaces:
                sample.pop(self.replaces[name], None)
            sample[name] = torch.cat([self.cache[self.by_key[k]]["states"] for k in keys])
        return sample
