"""Extract (optional): with the encoder frozen, run it once and train the decoder from its outputs.

Encoder outputs are stored in safetensors shards keyed by the content hash of the log-mel
features (a clip repeated in the data is encoded once). The stage's fingerprint covers the
weights and the preprocessing, so a changed encoder or feature setting makes a new cache.
Declines (trains from features) when the encoder trains or SpecAugment varies its input.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from mmcore import StageContext
from mmcore.data import FeatureCacheWriter, ShardDataset
from mmcore import StageResult, Manifest


def features_key(features: Any) -> str:
    return hashlib.sha256(features.contiguous().numpy().tobytes()).hexdigest()


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    from mm_pack_whisper.model import build_model

    training = ctx.config.training
    if "encoder" not in training.freeze or training.spec_augment:
        return None  # the encoder trains, or sees masked input: nothing fixed to cache
    model = build_model(upstream["download"].output("model"), upstream["convert"].output("checkpoint")).eval()
    encoder = model.model.encoder
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    cache = FeatureCacheWriter(ctx.stage_dir / "features")
    for i in ctx.progress(range(len(data)), description="extract", unit="clip"):
        features = data[i]["input_features"]
        key = cache.add(features_key(features), lambda f=features: encoder(f[None]).last_hidden_state[0])
        cache.add_sample({"encoder_states": [key]})
    unique = cache.close()
    return StageResult(
        outputs={"features": "features"},
        metrics={"unique_clips": unique, "samples": len(data)},
        notes=[f"cached encoder outputs of {unique} unique clips for {len(data)} samples"],
    )
