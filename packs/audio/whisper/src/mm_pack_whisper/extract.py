"""Extract (optional): with the encoder frozen, run it once and train the decoder from its outputs.

Encoder outputs are stored in safetensors shards keyed by the content hash of the log-mel
features (a clip repeated in the data is encoded once). The stage's fingerprint covers the
weights and the preprocessing, so a changed encoder or feature setting makes a new cache.
Declines (trains from features) when the encoder trains or SpecAugment varies its input.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.data.shards import ShardDataset, ShardWriter
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def features_key(features: Any) -> str:
    return hashlib.sha256(features.contiguous().numpy().tobytes()).hexdigest()


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    import torch

    from mm_pack_whisper.model import build_model

    training = ctx.config.training
    if "encoder" not in training.freeze or training.spec_augment:
        return None  # the encoder trains, or sees masked input: nothing fixed to cache
    model = build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    encoder = model.model.encoder
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    writer = ShardWriter(ctx.stage_dir / "encoder")
    keys: dict[str, int] = {}
    per_sample: list[str] = []
    for i in ctx.progress(range(len(data)), description="extract", unit="clip"):
        features = data[i]["input_features"]
        key = features_key(features)
        if key not in keys:
            with torch.no_grad():
                states = encoder(features[None]).last_hidden_state[0]
            keys[key] = writer.add({"encoder_states": states.float()}, length=len(states), meta={"key": key})
        per_sample.append(key)
    writer.close(by_key=keys, samples_key=per_sample)
    return StageResult(
        outputs={"encoder": "encoder"},
        metrics={"unique_clips": len(keys), "samples": len(data)},
        notes=[f"cached encoder outputs of {len(keys)} unique clips for {len(data)} samples"],
    )


class CachedEncoder:
    """The preprocessed dataset with ``input_features`` replaced by cached ``encoder_states``."""

    def __init__(self, data: ShardDataset, cache: ShardDataset) -> None:
        self.data = data
        self.cache = cache
        self.by_key = cache.index["by_key"]
        self.keys = cache.index["samples_key"]

    def __len__(self) -> int:
        return len(self.data)

    def meta(self, i: int) -> dict[str, Any]:
        return self.data.meta(i)

    def length(self, i: int) -> int:
        return self.data.length(i)

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = dict(self.data[i])
        del sample["input_features"]
        sample["encoder_states"] = self.cache[self.by_key[self.keys[self.data.indices[i]]]]["encoder_states"]
        return sample
