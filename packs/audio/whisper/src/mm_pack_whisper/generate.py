"""Transcribing: KV-cached greedy decoding in batches, ``mmcore infer``, and the evaluate stage.

One decoder serves the train stage's held-out WER (every rank runs the same number of steps,
as FSDP needs), the evaluate stage and ``infer`` (they stop when every row has ended). The
forced prefix (``<|startoftranscript|>``, language, task, ``<|notimestamps|>``) is each row's own;
rows of one batch share its length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mmcore import StageContext
from mmcore.engines import ModelSource, Request, cached_forward, generation_dtype
from mmcore import StageResult, Manifest


def greedy_decode(model: Any, source: Mapping[str, Any], prefix: Any, steps: int, eos_id: int, *, fixed_steps: bool = False) -> list[list[int]]:
    """Greedy transcripts after the forced ``prefix`` rows ([batch, P]), each cut at its end token.

    Args:
        source: ``input_features`` [batch, mels, frames], or cached ``encoder_states``.
        steps: tokens to generate at most.
        fixed_steps: run all ``steps`` decoder passes even when every row has ended (under
            FSDP every rank must call the model equally often).
    """
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    encoder = {"encoder_outputs": BaseModelOutput(last_hidden_state=source["encoder_states"])} if "encoder_states" in source else {"input_features": source["input_features"]}
    with torch.no_grad():
        out, cache = cached_forward(model, None, decoder_input_ids=prefix, **encoder)
        states = BaseModelOutput(last_hidden_state=out.encoder_last_hidden_state)
        ended = torch.zeros(prefix.shape[0], dtype=torch.bool, device=prefix.device)
        tokens = []
        for step in range(steps):
            token = out.logits[:, -1].argmax(-1).masked_fill(ended, eos_id)
            tokens.append(token)
            ended |= token == eos_id
            if step == steps - 1 or (ended.all() and not fixed_steps):
                break
            out, cache = cached_forward(model, cache, decoder_input_ids=token[:, None], encoder_outputs=states)
    rows = torch.stack(tokens, dim=1).tolist() if tokens else [[] for _ in range(prefix.shape[0])]
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]


def transcribe(model: Any, items: Sequence[tuple[Any, list[int]]], eos_id: int, steps: int, batch_size: int, progress: Callable[[Any, int], Any] | None = None) -> list[list[int]]:
    """Token ids of the transcripts of ``(features [mels, frames], forced prefix ids)`` items,
    batched by prefix length."""
    import torch

    from mmcore.engines import batches

    weight = next(model.parameters())
    out: list[list[int]] = [[] for _ in items]
    groups: list[list[int]] = []
    for length in sorted({len(prefix) for _, prefix in items}):
        same = [i for i, (_, prefix) in enumerate(items) if len(prefix) == length]
        groups += [[same[k] for k in group] for group in batches(same, batch_size, lambda i: 0)]
    for group in progress(groups, len(groups)) if progress else groups:
        features = torch.stack([items[i][0] for i in group]).to(weight.device, weight.dtype)
        prefix = torch.tensor([items[i][1] for i in group], device=weight.device)
        for i, tokens in zip(group, greedy_decode(model, {"input_features": features}, prefix, steps, eos_id)):
            out[i] = tokens
    return out


def load(ctx: StageContext, upstream: Mapping[str, Manifest], source: ModelSource) -> tuple[Any, Path]:
    """(the model in eval mode on the run's device, the folder with its tokenizer and feature extractor)."""
    from mm_pack_whisper.export import load_exported
    from mm_pack_whisper.model import build_model

    if source.kind == "train":
        folder = upstream["download"].output("model")
        model = build_model(folder, source.path)
    else:
        folder = source.path
        model = load_exported(folder)
    return model.eval().to(ctx.accelerator.device(), generation_dtype(ctx)), folder


def infer(ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
    """The transcript of each request's audio file (one per request), in ``data.language``."""
    from mm_pack_whisper.data import Encoder
    from mmcore.data import MediaError

    network, folder = load(ctx, upstream, model)
    encoder = Encoder(folder, ctx.config.data.task)
    prefix = encoder.labels("", ctx.config.data.language)
    prefix = prefix[: encoder.prefix_length(prefix)]
    answers: list[dict[str, Any]] = [{} for _ in requests]
    items, where = [], []
    for i, request in enumerate(requests):
        audios = request.media.get("audios", [])
        if len(audios) != 1 or set(request.media) != {"audios"}:
            answers[i] = {"error": "whisper transcribes one --audio file per request (no images or videos)"}
            continue
        try:
            items.append((encoder.input_features(encoder.audio(audios[0])), prefix))
        except MediaError as exc:
            answers[i] = {"error": " ".join(str(exc).split())}
            continue
        where.append(i)
    steps = min(ctx.config.generation.max_new_tokens, network.config.max_target_positions - len(prefix))
    progress = lambda groups, total: ctx.progress(groups, total=total, description="infer", unit="batch")  # noqa: E731
    for i, tokens in zip(where, transcribe(network, items, encoder.tokenizer.eos_token_id, steps, ctx.config.generation.batch_size, progress)):
        answers[i] = {"text": encoder.tokenizer.decode(tokens, skip_special_tokens=True).strip()}
    return answers


def word_normaliser(tokenizer: Any) -> tuple[Callable[[str], list[str]], str]:
    """(text -> words for WER, its name): Whisper's English normaliser where the tokenizer ships
    its spelling table (``normalizer.json``), else :func:`mmcore.engines.evaluation.normalize_words`
    (case-folded, punctuation but apostrophes removed)."""
    from mmcore.engines import normalize_words

    if getattr(tokenizer, "english_spelling_normalizer", None):
        return (lambda text: tokenizer.normalize(text).split()), "whisper-english"
    return normalize_words, "basic"


def evaluate(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    """WER and CER of the export's greedy transcripts of the held-out clips."""
    from mm_pack_whisper.data import Encoder
    from mmcore.engines import char_errors, word_errors
    from mm_pack_whisper.data import read_utterances
    from mmcore.engines import empty_evaluation, write_results, held_out_sources, keep_media

    network, folder = load(ctx, upstream, ModelSource("export", upstream["export"].output("model")))
    encoder = Encoder(folder, ctx.config.data.task)
    clips, skipped = held_out(ctx, upstream, encoder)
    if not clips:
        return empty_evaluation(ctx, skipped)
    longest = max(len(labels) for _, _, labels, _ in clips)
    steps = min(max(ctx.config.generation.max_new_tokens, longest), network.config.max_target_positions - 4)
    items = [(features, labels[: encoder.prefix_length(labels)]) for _, features, labels, _ in clips]
    progress = lambda groups, total: ctx.progress(groups, total=total, description="evaluate", unit="batch")  # noqa: E731
    transcripts = transcribe(network, items, encoder.tokenizer.eos_token_id, steps, ctx.config.generation.batch_size, progress)
    words, normaliser = word_normaliser(encoder.tokenizer)
    rows, totals = [], [0, 0, 0, 0]
    sources = held_out_sources(ctx, upstream, lambda path: read_utterances(path, ctx.config.data))  # the clips, to listen to in the report
    for (name, _, _, reference), tokens in zip(clips, transcripts):
        prediction = encoder.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        w, c = word_errors(reference, prediction, words), char_errors(reference, prediction, words)
        totals = [totals[0] + w[0], totals[1] + w[1], totals[2] + c[0], totals[3] + c[1]]
        clip = sources.get(name)
        rows.append({"item": name, "media": keep_media(ctx.stage_dir, [clip.audio]) if clip else [], "reference": reference, "prediction": prediction, "word_errors": w[0], "words": w[1]})
    metrics = {"items": len(rows), "skipped": skipped, "wer": totals[0] / max(totals[1], 1), "cer": totals[2] / max(totals[3], 1), "normaliser": normaliser}
    write_results(
        ctx.stage_dir,
        rows,
        metrics,
        title=f"whisper: greedy transcripts of the export {folder.name}/ of the held-out clips",
        columns=("item", "reference", "prediction", "word_errors", "words"),
        ctx=ctx,
    )
    note = f"{len(rows)} held-out clip(s), greedy with the KV cache: WER {metrics['wer']:.1%}, CER {metrics['cer']:.1%} ({normaliser} normaliser)"
    return StageResult(outputs={"results": "results.jsonl", "metrics": "metrics.json", "report": "report.html"}, metrics=metrics, notes=[note])


def held_out(ctx: StageContext, upstream: Mapping[str, Manifest], encoder: Any) -> tuple[list[tuple[str, Any, list[int], str]], int]:
    """(name, features, label ids, transcript) of the held-out clips (``evaluate.datasets``, or
    preprocess's eval split), at most ``evaluate.limit``; and how many bad samples were skipped."""
    from mm_pack_whisper.data import read_utterances
    from mmcore.data import MediaError, BadRecord, ShardDataset
    from mmcore.engines import read_held_out

    cfg = ctx.config.evaluate
    if not cfg.datasets:
        data = ShardDataset(upstream["preprocess"].output("dataset")).split("eval")
        picked = range(min(cfg.limit, len(data)))
        return [(data.meta(i)["source"], data[i]["input_features"], data[i]["labels"].tolist(), data.meta(i)["text"]) for i in picked], 0

    def encode(item: Any) -> tuple[Any, list[int], str]:
        return encoder.input_features(encoder.audio(item.audio)), encoder.labels(item.text, item.language or ctx.config.data.language), item.text

    items, skipped = read_held_out(ctx, lambda path: read_utterances(path, ctx.config.data), encode, (MediaError, BadRecord))
    return [(name, *encoded) for name, encoded in items], skipped
