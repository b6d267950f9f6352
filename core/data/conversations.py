"""The preprocess stage of conversation models: MLLM JSON -> token ids, labels and media
tensors in length-indexed shards, with train and eval splits and the bad-sample policy.

A pack supplies its encoder (a :class:`~mmcore.data.chatml.ChatMLEncoder` with its media
expanders) and, for its demo, a function that writes a synthetic dataset; the rest is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from mmcore.framework.context import StageContext
from mmcore.data.badsamples import BadSample, BadSamples
from mmcore.data.fillers import KINDS, encode_fillers, kinds_in
from mmcore.data.media import MediaError
from mmcore.data.mllm import read_samples
from mmcore.data.media import media_limits
from mmcore.data.shards import ShardWriter, held_out, split_key
from mmcore.data.workers import Failed, map_in_order
from mmcore.errors import StageError
from mmcore.framework.pack import StageResult
from mmcore.train.sampler import refuse_fewer_than_a_step

#: ``(folder, samples, seed) -> (train file, held-out file)``: writes a demo dataset.
DemoWriter = Callable[[Path, int, int], tuple[Path, Path]]


def dataset_files(ctx: StageContext, demo: DemoWriter | None, what: str) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files): ``data.datasets`` and ``data.eval_datasets``; without
    datasets and with ``data.demo_samples`` > 0, the demo's two files instead (a preset's demo
    data never mixes into a user's ``--data``); each recorded as an input of the stage."""
    cfg = ctx.config.data
    train_files, eval_files = [Path(p) for p in cfg.datasets], [Path(p) for p in cfg.eval_datasets]
    if cfg.demo_samples and demo is not None and not train_files:
        train, held = demo(ctx.stage_dir / "demo-data", cfg.demo_samples, ctx.seed)
        train_files.append(train)
        eval_files.append(held)
    if not train_files:
        raise StageError(f"no datasets: give --data FILE ({what}) or set data.datasets")
    for path in [*train_files, *eval_files]:
        ctx.record_input(path)
    return train_files, eval_files


def encode_pair(encoder: Any, pair: Any, limit: int) -> Any:
    """(chosen, rejected) encoded, each cut to ``limit``; or the reason the pair cannot train."""
    chosen = encoder.truncate(encoder.encode(pair.chosen), limit)
    rejected = encoder.truncate(encoder.encode(pair.rejected), limit)
    for name, enc in (("chosen", chosen), ("rejected", rejected)):
        if isinstance(enc, str):
            return f"the {name} answer: {enc}"
    if chosen.input_ids == rejected.input_ids:
        return "chosen and rejected encode to the same tokens"
    return chosen, rejected


def preprocess_conversations(ctx: StageContext, encoder: Any, *, demo: DemoWriter | None = None, tower_tokens: Callable[[dict[str, Any]], float] | None = None, **index_extra: Any) -> StageResult:
    """Encode ``data.datasets`` (train, less ``data.eval_fraction``) and ``data.eval_datasets``.

    Args:
        ctx: the preprocess stage's context; ``ctx.config.data`` is an MLLM data section with
            ``eval_datasets`` and ``demo_samples``.
        encoder: has ``encode(sample) -> Encoded`` and ``truncate(encoded, limit) -> Encoded | reason``
            (:class:`~mmcore.data.chatml.ChatMLEncoder` has both).
        demo: writes the synthetic dataset when ``data.demo_samples`` > 0.
        tower_tokens: a sample's tensors -> tokens through the model's towers (vision patches,
            audio frames), recorded per sample (``tower_tokens``) for the samplers to balance.
        index_extra: recorded in the dataset index (token ids collation needs, ...).
    """
    import torch

    cfg = ctx.config.data
    media_limits(cfg)
    train_files, eval_files = dataset_files(ctx, demo, "MLLM JSON")

    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    counts = {"train": 0, "eval": 0}
    kinds: dict[str, int] = {}  # media kind -> samples written that hold it
    ranking = getattr(cfg, "ranking", False)

    def encode(item: Any) -> Any:
        if ranking:
            return encode_pair(encoder, item, cfg.cutoff_len)
        return encoder.truncate(encoder.encode(item), cfg.cutoff_len)

    for path, split in [(p, "train") for p in train_files] + [(p, "eval") for p in eval_files]:
        if ranking:
            from mmcore.train.preference import read_pairs

            samples: list[Any] = list(read_pairs(path, cfg))
        else:
            samples = list(read_samples(path, cfg))
        encoded = map_in_order(encode, samples, cfg.num_workers, errors=(MediaError,), passes=lambda item: isinstance(item, BadSample))
        for item, result in ctx.progress(encoded, total=len(samples), description=f"preprocess {path.name}", unit="sample"):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            if isinstance(result, (str, Failed)):  # a MediaError, or the reason truncation gave up
                bad.report(BadSample(item.file, item.index, str(result)))
                continue
            this_split = split
            if split == "train" and cfg.eval_fraction and held_out(split_key(item.file, item.index), cfg.eval_fraction):
                this_split = "eval"
            if ranking:
                chosen, rejected = result
                tensors = {
                    "chosen_input_ids": torch.tensor(chosen.input_ids),
                    "chosen_labels": torch.tensor(chosen.labels),
                    "rejected_input_ids": torch.tensor(rejected.input_ids),
                    "rejected_labels": torch.tensor(rejected.labels),
                    **chosen.tensors,
                }
                length = len(chosen.input_ids) + len(rejected.input_ids)  # the two rows of a pair train together
            else:
                tensors = {"input_ids": torch.tensor(result.input_ids), "labels": torch.tensor(result.labels), **result.tensors}
                length = len(result.input_ids)
            # which media fields the sample has, so a sampler can keep kinds apart without reading it
            media = sorted(name for name in tensors if not name.endswith(("input_ids", "labels")))
            meta = {"split": this_split, "source": f"{Path(item.file).name}:{item.index}", "media": media}
            if tower_tokens is not None and media:
                meta["tower_tokens"] = int(tower_tokens(tensors))
            writer.add(tensors, length=length, meta=meta)
            counts[this_split] += 1
            for kind in kinds_in([item]):
                kinds[kind] = kinds.get(kind, 0) + 1
    skipped = bad.close()
    if counts["train"] == 0:
        raise StageError("no usable training samples" + (f" ({skipped})" if skipped else ""))
    refuse_fewer_than_a_step(ctx.config, counts["train"], "preference pairs" if ranking else "samples")
    # a filler for each kind some samples hold and others lack: for ranks whose micro-batch lacks a kind another rank's holds
    uneven = [k for k in KINDS if 0 < kinds.get(k, 0) < counts["train"] + counts["eval"]]
    for kind, filler in encode_fillers(encoder, uneven, ctx.stage_dir / "fillers").items():
        writer.add_filler(kind, filler)
    index = writer.close(**index_extra, ranking=ranking)
    lengths = [s["length"] for s in index["samples"] if "filler" not in s]
    what = "preference pairs" if ranking else "samples"
    notes = [f"{counts['train']} train / {counts['eval']} eval {what}, {sum(lengths)} tokens (longest {max(lengths)})"]
    if cfg.num_workers:
        notes.append(f"encoded in {cfg.num_workers} worker processes (data.num_workers)")
    if skipped:
        notes.append(skipped)
    return StageResult(
        outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"},
        metrics={"train_samples": counts["train"], "eval_samples": counts["eval"], "skipped": len(bad.found), "tokens": sum(lengths)},
        notes=notes,
    )
