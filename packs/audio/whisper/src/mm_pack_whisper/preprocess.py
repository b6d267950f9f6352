"""Preprocess: transcript datasets -> log-mel features and label ids in shards (train and eval splits)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from mmcore.context import StageContext
from mmcore.data.badsamples import BadSample, BadSamples
from mmcore.data.media import MediaError
from mmcore.data.mllm import BadRecord
from mmcore.data.shards import ShardWriter, held_out
from mmcore.errors import StageError
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch

    from mm_pack_whisper.data import Encoder, read_utterances
    from mm_pack_whisper.demo import write_demo_dataset
    from mmcore.data.conversations import dataset_files
    from mmcore.data.media import media_limits

    cfg = ctx.config.data
    media_limits(cfg)
    model_dir = upstream["download"].output("model")
    encoder = Encoder(model_dir, cfg.task)
    train_files, eval_files = dataset_files(ctx, write_demo_dataset, "transcript JSON/JSONL or MLLM JSON with <audio>")

    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    counts = {"train": 0, "eval": 0}
    seconds = 0.0
    for path, split in [(p, "train") for p in train_files] + [(p, "eval") for p in eval_files]:
        items = list(read_utterances(path, cfg))
        for item in ctx.progress(items, description=f"preprocess {path.name}", unit="clip"):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            try:
                samples = encoder.audio(item.audio)
                labels = encoder.labels(item.text, item.language)
            except (MediaError, BadRecord) as exc:
                bad.report(BadSample(item.file, item.index, str(exc)))
                continue
            this_split = split
            if split == "train" and cfg.eval_fraction and held_out(f"{item.file}:{item.index}", cfg.eval_fraction):
                this_split = "eval"
            tensors = {"input_features": encoder.input_features(samples), "labels": torch.tensor(labels)}
            meta = {"split": this_split, "source": f"{Path(item.file).name}:{item.index}", "audio": str(item.audio),
                    "text": item.text, "language": item.language, "prefix": encoder.prefix_length(labels)}
            writer.add(tensors, length=len(labels), meta=meta)
            counts[this_split] += 1
            seconds += len(samples) / encoder.features.sampling_rate
    skipped = bad.close()
    if counts["train"] == 0:
        raise StageError("no usable training clips" + (f" ({skipped})" if skipped else ""))
    writer.close(eos_id=encoder.tokenizer.eos_token_id, task=cfg.task, sampling_rate=encoder.features.sampling_rate)
    notes = [f"{counts['train']} train / {counts['eval']} eval clips, {seconds / 60:.1f} min of audio"]
    if skipped:
        notes.append(skipped)
    return StageResult(
        outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"},
        metrics={"train_samples": counts["train"], "eval_samples": counts["eval"], "skipped": len(bad.found), "audio_seconds": round(seconds, 3)},
        notes=notes,
    )
