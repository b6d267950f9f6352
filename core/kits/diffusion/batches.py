"""What training reads: the samples (cached features, or clips to encode per batch) and the
micro-batches they are collated into."""

from __future__ import annotations

from typing import Any, Sequence

from mmcore.errors import StageError
from mmcore.kits.diffusion.latents import is_named, regroup, shape_of, stack


class FreshSamples:
    """Preprocessed clips with their captions, encoded during training (no extract stage)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.data[i]
        return {**{k: item[k] for k in ("frames", "rejected_frames", "audio") if k in item}, "caption": self.data.meta(i)["caption"]}


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples of one bucket -> a micro-batch: cached tensors stacked, or clips and captions
    listed for :func:`encode`; ``num_loss_tokens`` counts the samples (the loss is per sample)."""
    import torch

    samples = [regroup(s) for s in samples]  # named latents cached as latents.<name> fields
    shapes = {shape_of(s["latents"]) if "latents" in s else tuple(s["frames"].shape) for s in samples}
    if len(shapes) > 1:
        raise StageError(f"a micro-batch mixes shapes {sorted(shapes)}; the sampler groups by bucket, so the cache and the preprocessed data disagree: rerun preprocess and extract with --force")
    batch: dict[str, Any] = {"num_loss_tokens": len(samples)}  # the loss is per sample
    if "latents" in samples[0]:  # cached: latents, text and any conditions, stacked
        for name, value in samples[0].items():
            if isinstance(value, torch.Tensor) or (name == "latents" and is_named(value)):
                batch[name] = stack([s[name] for s in samples])
    else:
        batch["frames"] = [s["frames"] for s in samples]
        batch["captions"] = [s["caption"] for s in samples]
        for name in ("rejected_frames", "audio"):
            if name in samples[0]:
                batch[name] = [s[name] for s in samples]
    return batch


def encode(batch: dict[str, Any], encoders: Any, conditions: Sequence[str] = ()) -> None:
    """A batch of :class:`FreshSamples` encoded in place with the live ``encoders`` (none: the
    batch is cached features already): ``latents`` (and a preference pair's
    ``rejected_latents``), ``text`` and the family's ``conditions``. In place, because the
    step's FLOPs read the latents' shape."""
    import torch

    if encoders is None:
        return
    # a clip with its sound track (data.audio_rate): the encoders take both and give named latents
    clips = [encoders.latents(f, a) for f, a in zip(batch["frames"], batch["audio"])] if "audio" in batch else [encoders.latents(f) for f in batch["frames"]]
    batch["latents"] = stack(clips)
    if "rejected_frames" in batch:
        batch["rejected_latents"] = torch.stack([encoders.latents(f) for f in batch["rejected_frames"]])
    batch["text"] = torch.stack([encoders.text(c) for c in batch["captions"]])
    if conditions:
        made = [encoders.conditions(f) for f in batch["frames"]]
        batch.update({name: torch.stack([m[name] for m in made]) for name in conditions})


__all__ = ["FreshSamples", "collate", "encode"]
