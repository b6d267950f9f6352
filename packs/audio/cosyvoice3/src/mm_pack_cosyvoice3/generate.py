"""Evaluate and infer: text -> speech (LM tokens -> flow mel -> HiFT waveform), heard by a fixed checker.

``evaluate`` speaks the held-out texts with the export (the public folder, loaded strictly),
writes each wav, and transcribes it with :func:`mmcore.data.transcribe_digits` -- a fixed
pitch reader for the spoken-digit demo (no model trained alongside), so its WER measures what
the speech says. For data other than spoken digits that WER means nothing (``checker`` in the
metrics says which checker ran); the wavs and ``report.html`` (audio players) are the output.
``infer`` writes one wav per ``--prompt`` under the stage folder and says where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from mmcore import Manifest, StageContext, StageResult
from mmcore.engines import ModelSource, Request


def load(ctx: StageContext, upstream: Mapping[str, Manifest], source: ModelSource) -> tuple[Any, Path]:
    """(the model in eval mode, the folder with its tokenizer): the export or a folder loaded
    strictly from the public files, or the trained checkpoint on the download's folder."""
    from mm_pack_cosyvoice3.model import build_model, load_pretrained

    if source.kind == "train":
        folder = Path(upstream["download"].output("model"))
        return build_model(folder, Path(source.path)).eval(), folder
    folder = Path(source.path)
    return load_pretrained(folder), folder


def speak(model: Any, encoder: Any, text: str, ctx: StageContext, index: int) -> Any:
    from mm_pack_cosyvoice3.synth import synthesize

    gen = ctx.config.speech
    generator = torch.Generator().manual_seed(ctx.seed * 100_003 + index)
    return synthesize(model, encoder.text_ids(text), sampling=gen.sampling, generator=generator, n_timesteps=gen.flow_steps, vocoder=gen.vocoder, cfg_rate=gen.cfg_rate)


def evaluate(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    """The export speaks each held-out text; the fixed checker's WER on what it says."""
    from mmcore.data import digits_wer, transcribe_digits
    from mmcore.engines import empty_evaluation, keep_media, write_results

    from mm_pack_cosyvoice3.preprocess import Encoder
    from mm_pack_cosyvoice3.synth import write_wav

    model, folder = load(ctx, upstream, ModelSource("export", upstream["export"].output("model")))
    encoder = Encoder(folder)
    items = held_out_texts(ctx, upstream)
    if not items:
        return empty_evaluation(ctx, 0)
    rows, refs, heard = [], [], []
    for i, (name, text, audio) in enumerate(ctx.progress(items, total=len(items), description="evaluate", unit="clip")):
        try:
            speech = speak(model, encoder, text, ctx, i)
            wav = write_wav(ctx.stage_dir / "speech" / f"{i:04d}.wav", speech.wav, speech.sample_rate)
            said = transcribe_digits(speech.wav.float().numpy(), speech.sample_rate)
            tokens = len(speech.tokens)
        except ValueError as exc:  # the LM stopped at once
            wav, said, tokens = None, "", 0
            ctx.say(f"{name}: {exc}")
        refs.append(text)
        heard.append(said)
        errors = round(digits_wer([text], [said]) * len(text.split()))
        media = keep_media(ctx.stage_dir, [p for p in (audio, wav) if p])
        rows.append({"item": name, "media": media, "text": text, "heard": said, "word_errors": errors, "speech_tokens": tokens})
    metrics = {"items": len(rows), "wer": digits_wer(refs, heard), "checker": "spoken digits by pitch (mmcore.data.transcribe_digits)"}
    write_results(
        ctx.stage_dir, rows, metrics, title=f"cosyvoice3: the export {Path(folder).name}/ speaks the held-out texts", columns=("item", "text", "heard", "word_errors", "speech_tokens"), ctx=ctx
    )
    note = f"{len(rows)} held-out text(s) spoken ({ctx.config.speech.sampling}, {ctx.config.speech.flow_steps} flow steps, CFG {ctx.config.speech.cfg_rate if ctx.config.speech.cfg_rate is not None else 'of the yaml'}, vocoder {ctx.config.speech.vocoder}); the fixed checker's WER {metrics['wer']:.1%}; wavs under {ctx.stage_dir / 'speech'}"
    return StageResult(outputs={"results": "results.jsonl", "metrics": "metrics.json", "report": "report.html"}, metrics=metrics, notes=[note])


def held_out_texts(ctx: StageContext, upstream: Mapping[str, Manifest]) -> list[tuple[str, str, Path | None]]:
    """(name, text, the recorded clip or None) of ``evaluate.datasets`` (records with ``text``;
    ``audio`` optional), else preprocess's eval split; at most ``evaluate.limit``."""
    from mmcore.data import ShardDataset, load_records

    cfg = ctx.config.evaluate
    if cfg.datasets:
        out = []
        for path in map(Path, cfg.datasets):
            for index, record in enumerate(load_records(path)):
                if isinstance(record, dict) and isinstance(record.get("text"), str) and record["text"].strip():
                    audio = record.get("audio")
                    out.append((f"{path.name}:{index}", record["text"].strip(), path.parent / audio if isinstance(audio, str) else None))
        return out[: cfg.limit]
    data = ShardDataset(upstream["preprocess"].output("dataset")).split("eval")
    return [(data.meta(i)["source"], data.meta(i)["text"], Path(data.meta(i)["audio"])) for i in range(min(cfg.limit, len(data)))]


def infer(ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
    """Each request's prompt spoken into ``<stage>/NNNN.wav``: ``{"audio": path, "heard": ...}``
    (``heard``: the spoken-digit checker's transcript, meaningful for digit sentences only)."""
    from mmcore.data import transcribe_digits

    from mm_pack_cosyvoice3.preprocess import Encoder
    from mm_pack_cosyvoice3.synth import write_wav

    network, folder = load(ctx, upstream, model)
    encoder = Encoder(folder)
    first = 1 + max((int(p.stem) for p in ctx.stage_dir.glob("[0-9]*.wav") if p.stem.isdigit()), default=0)
    answers: list[dict[str, Any]] = []
    for i, request in enumerate(requests):
        if request.media or not request.prompt.strip():
            answers.append({"error": "cosyvoice3 speaks a text --prompt (no media)"})
            continue
        try:
            speech = speak(network, encoder, request.prompt.strip(), ctx, i)
        except ValueError as exc:
            answers.append({"error": str(exc)})
            continue
        path = write_wav(ctx.stage_dir / f"{first + i:04d}.wav", speech.wav, speech.sample_rate)
        answers.append({"audio": str(path), "seconds": round(len(speech.wav) / speech.sample_rate, 2), "heard": transcribe_digits(speech.wav.float().numpy(), speech.sample_rate)})
    return answers
