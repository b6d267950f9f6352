"""Captioned videos -> frames sampled to the target fps, resized into buckets (the preprocess
stage of the diffusion kit).

Each video is probed once (frames, fps, size), assigned the bucket of the closest aspect ratio
it is long enough for, sampled, scaled to cover and centre-cropped; frames are stored as uint8
with the caption. Corrupt, truncated and too-short videos follow ``data.on_bad_sample``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable

from mmcore.framework.context import StageContext
from mmcore.data.badsamples import BadSample, BadSamples
from mmcore.data.captions import read_caption_pairs, read_captions
from mmcore.data.shards import ShardWriter, held_out, split_key
from mmcore.data.workers import Failed, map_in_order
from mmcore.data.media import media_limits
from mmcore.data.video import MediaError, choose_bucket, probe, resize_crop, sample_frames
from mmcore.errors import StageError
from mmcore.framework.pack import StageResult


def sound_track(media: Path, rate: int, seconds: float) -> Any:
    """``seconds`` of ``media``'s sound from its start, mono float32 at ``rate``: cut, or padded
    with silence where it is shorter; silence for a video without a sound track."""
    import numpy as np

    from mmcore.data.audio import load_audio

    count = round(seconds * rate)
    try:
        samples = load_audio(media, rate)
    except MediaError as exc:
        if "has no audio stream" not in str(exc):
            raise
        samples = np.zeros(0, np.float32)
    return np.pad(samples[:count], (0, max(0, count - len(samples[:count])))).astype(np.float32)


class _Clip:
    def __init__(self, media: Path) -> None:
        self.media = media


def preprocess_captioned_videos(ctx: StageContext, demo: Callable[[Path, int, int], Path] | None = None) -> StageResult:
    """The preprocess stage of captioned videos: ``data.datasets`` (without any, the demo's clips
    when ``data.demo_samples`` > 0) into a shard dataset of uint8 frames with caption and bucket.
    With ``data.ranking``, preference pairs: both videos of a pair (``frames`` and
    ``rejected_frames``, one bucket), ``data.eval_fraction`` of them held out."""
    import torch

    cfg = ctx.config.data
    media_limits(cfg)
    datasets = [Path(p) for p in cfg.datasets]
    if cfg.demo_samples and demo is not None and not datasets:
        datasets.append(demo(ctx.stage_dir / "demo-data", cfg.demo_samples, ctx.seed))
    if not datasets:
        raise StageError("no datasets: give --data CAPTIONS.json or a folder of videos with .txt captions")
    audio_rate = getattr(cfg, "audio_rate", None)
    if audio_rate and getattr(cfg, "ranking", False):
        raise StageError("data.audio_rate with data.ranking: preference pairs of clips with sound are not supported yet")
    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    buckets: Counter[str] = Counter()

    def encode(item: Any) -> tuple[tuple[int, int, int], Any]:
        info = probe(item.media)
        bucket = choose_bucket(info, cfg.buckets, cfg.fps)
        if bucket is None:
            raise MediaError(
                f"video {item.media} is too short: {info.frames} frame(s) at {info.fps:g} fps give fewer than the {min(b[2] for b in cfg.buckets)} frames at {cfg.fps:g} fps any bucket needs"
            )
        height, width, frames = bucket
        images = sample_frames(item.media, info, fps=cfg.fps, count=frames)
        pixels = torch.from_numpy(resize_crop(images, height, width))
        if audio_rate:  # the sound of the frames' time span: frames / fps seconds from the start
            return bucket, (pixels, torch.from_numpy(sound_track(item.media, audio_rate, frames / cfg.fps)))
        return bucket, pixels

    ranking = getattr(cfg, "ranking", False)
    if ranking:
        one = encode

        def encode(item: Any) -> tuple[tuple[int, int, int], Any]:  # type: ignore[no-redef]
            (bucket, chosen), (other, rejected) = one(_Clip(item.chosen)), one(_Clip(item.rejected))
            if bucket != other:
                raise MediaError(f"chosen and rejected fall in different buckets ({'x'.join(map(str, bucket))} and {'x'.join(map(str, other))}): the two videos of a pair must share one shape")
            return bucket, (chosen, rejected)

    counts = {"train": 0, "eval": 0}
    for dataset in datasets:
        ctx.record_input(dataset)
        items = list(read_caption_pairs(dataset) if ranking else read_captions(dataset))
        encoded = map_in_order(encode, items, cfg.num_workers, errors=(MediaError,), passes=lambda item: isinstance(item, BadSample))
        for item, result in ctx.progress(encoded, total=len(items), description=f"preprocess {dataset.name}", unit="video"):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            if isinstance(result, Failed):
                bad.report(BadSample(item.file, item.index, str(result)))
                continue
            bucket, pixels = result
            height, width, frames = bucket
            if ranking:
                split = "eval" if cfg.eval_fraction and held_out(split_key(item.file, item.index), cfg.eval_fraction) else "train"
                writer.add(
                    {"frames": pixels[0], "rejected_frames": pixels[1]},
                    length=2 * frames,
                    meta={"caption": item.caption, "bucket": list(bucket), "source": str(item.chosen), "rejected": str(item.rejected), "split": split},
                )
                counts[split] += 1
            else:
                split = "eval" if cfg.eval_fraction and held_out(split_key(item.file, item.index), cfg.eval_fraction) else "train"
                tensors = {"frames": pixels[0], "audio": pixels[1]} if audio_rate else {"frames": pixels}
                writer.add(tensors, length=frames, meta={"caption": item.caption, "bucket": list(bucket), "source": str(item.media), "split": split})
                counts[split] += 1
            buckets[f"{height}x{width}x{frames}"] += 1
    skipped = bad.close()
    if not writer.samples:
        raise StageError("no usable videos" + (f" ({skipped})" if skipped else ""))
    from mmcore.train.sampler import refuse_fewer_than_a_step

    refuse_fewer_than_a_step(ctx.config, counts["train"], "preference pairs" if ranking else "clips")
    writer.close(fps=cfg.fps, ranking=ranking, **({"audio_rate": audio_rate} if audio_rate else {}))
    what = f"{'pairs' if ranking else 'clips'} ({counts['train']} train / {counts['eval']} held out)" if ranking or counts["eval"] else "clips"
    notes = [f"{len(writer.samples)} {what} in buckets " + ", ".join(f"{k}: {v}" for k, v in sorted(buckets.items()))]
    if skipped:
        notes.append(skipped)
    return StageResult(outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"}, metrics={"clips": len(writer.samples), "skipped": len(bad.found), "buckets": dict(buckets)}, notes=notes)
