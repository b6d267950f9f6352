"""The extract stage: every clip's VAE latents, caption embedding and conditions into the
feature cache (:mod:`mmcore.data.feature_cache`), keyed by content and the checkpoint's
fingerprint, so a rerun or a resume after a kill encodes only what is missing."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Mapping

from mmcore.framework.context import StageContext
from mmcore.kits.diffusion.latents import PREFIX
from mmcore.framework.pack import StageResult
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.diffusion.family import DiffusionFamily


def content_key(*parts: Any) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


class FeatureExtraction:
    """The extract stage of one family: :meth:`run` encodes the preprocessed clips with the
    family's ``encoders``."""

    def __init__(self, family: "DiffusionFamily") -> None:
        self.family = family

    def run(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        from mmcore.data.feature_cache import FeatureCacheWriter
        from mmcore.data.shards import ShardDataset

        data = ShardDataset(upstream["preprocess"].output("dataset"))
        identity = upstream["download"].fingerprint
        length = ctx.config.data.max_sequence_length
        encoders = self.family.encoders(upstream["download"].output("model"), length)
        cache = FeatureCacheWriter(ctx.stage_dir / "features")
        empty = cache.add(content_key("text", "", length, identity), lambda: encoders.text(""))
        for i in ctx.progress(range(len(data)), description="extract", unit="clip"):
            meta, frames = data.meta(i), data[i]["frames"]
            latents = self.cached_latents(cache, encoders, frames, data[i].get("audio"), meta["bucket"], identity)  # encoded first, as always
            text = cache.add(content_key("text", meta["caption"], length, identity), lambda: encoders.text(meta["caption"]))
            refs = {**latents, "text": [text]}
            refs.update(self.cached_conditions(cache, encoders, frames, meta["bucket"], identity))
            if "rejected_frames" in data[i]:  # a preference pair: its other video too
                other = data[i]["rejected_frames"]
                refs["rejected_latents"] = [cache.add(content_key("latents", other.numpy().tobytes(), meta["bucket"], identity), lambda: encoders.latents(other))]
            cache.add_sample(refs)
        cache.close(empty_text=empty)
        return StageResult(
            outputs={"features": "features"},
            metrics={"clips": len(data), "encoded": cache.encoded, "reused": cache.reused},
            notes=[
                f"cached latents, text embeddings{''.join(', ' + c for c in self.family.conditions)} of {len(data)} clips: {cache.encoded} tensors encoded, {cache.reused} found already encoded (repeated captions, or a run before)"
            ],
        )

    def cached_latents(self, cache: Any, encoders: Any, frames: Any, audio: Any, bucket: Any, identity: str) -> dict[str, list[str]]:
        """The clip's latents in the cache: ``latents``, or for a clip with its sound track
        (``audio``, from ``data.audio_rate``) the encoders' named latents, one field each
        (``latents.video``, ``latents.audio``: :func:`~mmcore.kits.diffusion.latents.regroup`)."""
        if audio is None:
            return {"latents": [cache.add(content_key("latents", frames.numpy().tobytes(), bucket, identity), lambda: encoders.latents(frames))]}
        made: dict[str, Any] = {}
        content = frames.numpy().tobytes() + audio.numpy().tobytes()
        names = encoders.latent_names

        def part(name: str) -> Any:
            if not made:
                made.update(encoders.latents(frames, audio))
            return made[name]

        return {f"{PREFIX}{name}": [cache.add(content_key("latents", name, content, bucket, identity), lambda name=name: part(name))] for name in names}

    def cached_conditions(self, cache: Any, encoders: Any, frames: Any, bucket: Any, identity: str) -> dict[str, list[str]]:
        """The clip's conditioning tensors in the cache (made together, once, where any is missing)."""
        made: dict[str, Any] = {}

        def part(name: str) -> Any:
            if not made:
                made.update(encoders.conditions(frames))
            return made[name]

        content = frames.numpy().tobytes()
        return {name: [cache.add(content_key(name, content, bucket, identity), lambda name=name: part(name))] for name in self.family.conditions}


__all__ = ["content_key", "FeatureExtraction"]
