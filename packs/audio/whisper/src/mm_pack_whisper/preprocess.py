"""Preprocess: transcript datasets -> log-mel features and label ids in shards (train and eval splits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore import StageContext
from mmcore.data import BadSample, BadSamples, MediaError, BadRecord, ShardWriter, held_out, Failed, map_in_order
from mmcore import StageError, StageResult, Manifest


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch

    from mm_pack_whisper.data import Encoder, read_utterances
    from mm_pack_whisper.demo import write_demo_dataset
    from mmcore.data import dataset_files, media_limits
    from mmcore.train import refuse_fewer_than_a_step

    cfg = ctx.config.data
    media_limits(cfg)
    model_dir = upstream["download"].output("model")
    encoder = Encoder(model_dir, cfg.task)
    train_files, eval_files = dataset_files(ctx, write_demo_dataset, "transcript JSON/JSONL or MLLM JSON with <audio>")

    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    counts = {"train": 0, "eval": 0}
    seconds = 0.0

    def encode(item: Any) -> tuple[int, list[int], Any]:
        samples = encoder.audio(item.audio)
        labels = encoder.labels(item.text, item.language)
        return len(samples), labels, encoder.input_features(samples)

    for path, split in [(p, "train") for p in train_files] + [(p, "eval") for p in eval_files]:
        items = list(read_utterances(path, cfg))
        encoded = map_in_order(encode, items, cfg.num_workers, errors=(MediaError, BadRecord), passes=lambda item: isinstance(item, BadSample))
        for item, result in ctx.progress(encoded, total=len(items), description=f"preprocess {path.name}", unit="clip"):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            if isinstance(result, Failed):
                bad.report(BadSample(item.file, item.index, str(result)))
                continue
            n_samples, labels, features = result
            this_split = split
            if split == "train" and cfg.eval_fraction and held_out(f"{item.file}:{item.index}", cfg.eval_fraction):
                this_split = "eval"
            tensors = {"input_features": features, "labels": torch.tensor(labels)}
            meta = {
                "split": this_split,
                "source": f"{Path(item.file).name}:{item.index}",
                "audio": str(item.audio),
                "text": item.text,
                "language": item.language,
                "prefix": encoder.prefix_length(labels),
            }
            writer.add(tensors, length=len(labels), meta=meta)
            counts[this_split] += 1
            seconds += n_samples / encoder.features.sampling_rate
    skipped = bad.close()
    if counts["train"] == 0:
        raise StageError("no usable training clips" + (f" ({skipped})" if skipped else ""))
    refuse_fewer_than_a_step(ctx.config, counts["train"], "clips")
    writer.close(eos_id=encoder.tokenizer.eos_token_id, task=cfg.task, sampling_rate=encoder.features.sampling_rate)
    notes = [f"{counts['train']} train / {counts['eval']} eval clips, {seconds / 60:.1f} min of audio"]
    if skipped:
        notes.append(skipped)
    return StageResult(
        outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"},
        metrics={"train_samples": counts["train"], "eval_samples": counts["eval"], "skipped": len(bad.found), "audio_seconds": round(seconds, 3)},
        notes=notes,
    )
