"""Preprocess: MLLM JSON datasets -> tokenized, length-indexed shards (train and eval splits)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.data.badsamples import BadSample, BadSamples
from mmcore.data.mllm import read_samples
from mmcore.data.shards import ShardWriter
from mmcore.errors import StageError
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def _held_out(sample_key: str, fraction: float) -> bool:
    """A stable split: the same sample lands in the same split on every run."""
    digest = hashlib.sha256(sample_key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from mm_pack_qwen2vl.data import Encoder, MediaError

    cfg = ctx.config.data
    model_dir = upstream["download"].output("model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    merge = AutoConfig.from_pretrained(model_dir).vision_config.spatial_merge_size
    encoder = Encoder(tokenizer, cfg, merge_size=merge)

    train_files, eval_files = [Path(p) for p in cfg.datasets], [Path(p) for p in cfg.eval_datasets]
    if cfg.demo_samples:
        from mm_pack_qwen2vl.demo import write_demo_dataset

        train, held_out = write_demo_dataset(ctx.stage_dir / "demo-data", cfg.demo_samples, ctx.seed)
        train_files.append(train)
        eval_files.append(held_out)
    if not train_files:
        raise StageError("no datasets: give --data FILE (MLLM JSON) or set data.datasets")
    for path in [*train_files, *eval_files]:
        ctx.record_input(path)

    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    counts = {"train": 0, "eval": 0}
    jobs = [(p, "train") for p in train_files] + [(p, "eval") for p in eval_files]
    for path, split in jobs:
        samples = list(read_samples(path, cfg))
        for item in ctx.progress(samples, description=f"preprocess {path.name}", unit="sample"):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            try:
                encoded = encoder.encode(item)
            except MediaError as exc:
                bad.report(BadSample(item.file, item.index, str(exc)))
                continue
            result = encoder.truncate(encoded)
            if isinstance(result, str):
                bad.report(BadSample(item.file, item.index, result))
                continue
            this_split = split
            if split == "train" and cfg.eval_fraction and _held_out(f"{item.file}:{item.index}", cfg.eval_fraction):
                this_split = "eval"
            tensors: dict[str, Any] = {"input_ids": torch.tensor(result.input_ids), "labels": torch.tensor(result.labels), **result.tensors}
            writer.add(tensors, length=len(result.input_ids), meta={"split": this_split, "source": f"{Path(item.file).name}:{item.index}"})
            counts[this_split] += 1
    skipped = bad.close()
    if counts["train"] == 0:
        raise StageError("no usable training samples" + (f" ({skipped})" if skipped else ""))
    index = writer.close(
        pad_id=tokenizer.pad_token_id,
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        tokenizer=str(model_dir),
    )
    lengths = [s["length"] for s in index["samples"]]
    notes = [f"{counts['train']} train / {counts['eval']} eval samples, {sum(lengths)} tokens (longest {max(lengths)})"]
    if skipped:
        notes.append(skipped)
    return StageResult(
        outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"},
        metrics={"train_samples": counts["train"], "eval_samples": counts["eval"], "skipped": len(bad.found), "tokens": sum(lengths)},
        notes=notes,
    )
