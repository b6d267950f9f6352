"""What training reads: the samples (cached features, or clips to encode per batch) and the
micro-batches they are collated into."""

from __future__ import annotations

from typing import Any, Sequence

from mmcore.errors import StageError


class FreshSamples:
    """Preprocessed clips with their captions, encoded during training (no extract stage)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.data[i]
        return {**{k: item[k] for k in ("frames", "rejected_frames") if k in item}, "caption": self.data.meta(i)["caption"]}


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples of one bucket -> a micro-batch: cached tensors stacked, or clips and captions
    listed for :func:`encode`; ``num_loss_tokens`` counts the samples (the loss is per sample)."""
    import torch

    shapes = {tuple(s["latents"].shape if "latents" in s else s["frames"].shape) for s in samples}
    if len(shapes) > 1:
        raise StageError(f"a micro-batch mixes shapes {sorted(shapes)}; the sampler groups by bucket, so the cache and the preprocessed data disagree: rerun preprocess and extract with --force")
    batch: dict[str, Any] = {"num_loss_tokens": len(samples)}  # the loss is per sample
    if "latents" in samples[0]:  # cached: latents, text and any conditions, stacked
        for name, value in samples[0].items():
            if isinstance(value, torch.Tensor):
                batch[name] = torch.stack([s[name] for s in samples])
    else:
        batch["frames"] = [s["frames"] for s in samples]
        batch["captions"] = [s["caption"] for s in samples]
        if "rejected_frames" in samples[0]:
            batch["rejected_frames"] = [s["rejected_frames"] for s in samples]
    return batch


def encode(batch: dict[str, Any], encoders: Any, conditions: Sequence[str] = ()) -> None:
    """A batch of :class:`FreshSamples` encoded in place with the live ``encoders`` (none: the
    batch is cached features already): ``latents`` (and a preference pair's
    ``rejected_latents``), ``text`` and the family's ``conditions``. In place, because the
    step's FLOPs read the latents' shape."""
    import torch

    if encoders is None:
        return
    batch["latents"] = torch.stack([encoders.latents(f) for f in batch["frames"]])
    if "rejected_frames" in batch:
        batch["rejected_latents"] = torch.stack([encoders.latents(f) for f in batch["rejected_frames"]])
    batch["text"] = torch.stack([encoders.text(c) for c in batch["captions"]])
    if conditions:
        made = [encoders.conditions(f) for f in batch["frames"]]
        batch.update({name: torch.stack([m[name] for m in made]) for name in conditions})


__all__ = ["FreshSamples", "collate", "encode"]
