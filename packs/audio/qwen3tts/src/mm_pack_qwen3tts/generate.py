"""Speaking: ``mmcore infer --prompt "..."`` (text -> codes -> a 24 kHz wav), and the evaluate
stage (held-out texts -> codes -> wav, heard by a fixed checker; code-level metrics too).

The waveform comes from ``speech.vocoder``: the speech tokenizer's decoder (``codec``), or
Griffin-Lim over the demo's code spectra (``griffin_lim``, :mod:`mm_pack_qwen3tts.demo`). The
fixed checker (:func:`mmcore.data.transcribe_digits`: energy segments, each one's pitch -> the
nearest digit) transcribes every wav: ``wer`` (and ``heard`` per item, per infer answer) means
something for the spoken-digit demo only.

Evaluate measures, on the held-out split (or ``evaluate.datasets``): the teacher-forced
accuracy of codebook 0 and of codebooks 1..G-1 (as training's held-out metrics), and for the
generated codes (greedy, or sampled with ``generation.temperature`` > 0) the exact-match rate
(every frame of every codebook and the length equal to the target codes), the share of target
frames whose codes the generated frame at the same position equals, and the same for codebook 0
alone (``codebook0_match_rate``: where it is high and the frames' is not, the code predictor's
codebooks differ). ``report.html`` plays the reference clip and the
generated wav of each item.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore import Manifest, StageContext, StageError, StageResult
from mmcore.engines import ModelSource, Request


def load(ctx: StageContext, upstream: Mapping[str, Manifest], source: ModelSource) -> tuple[Any, Any, Path]:
    """(the model in eval mode, the codec's decoder, the folder with the tokenizer and ``speech_tokenizer/``)."""
    from mm_pack_qwen3tts.export import load_exported
    from mm_pack_qwen3tts.model import build_model, load_codec

    if source.kind == "train":
        folder = Path(upstream["download"].output("model"))
        model = build_model(folder, source.path)
    else:
        folder = Path(source.path)
        model = load_exported(folder)
    return model.eval(), load_codec(folder), folder


def vocoder(ctx: StageContext, folder: Path, codec: Any) -> Any:
    """``codes (F x Q) -> waveform`` as ``speech.vocoder`` says."""
    if ctx.config.speech.vocoder == "griffin_lim":
        from mm_pack_qwen3tts.demo import load_spectra, voice

        spectra = load_spectra(folder)
        return lambda codes: voice(codes, spectra)
    return codec.decode


def heard(wav: Any, rate: int) -> str:
    from mmcore.data import transcribe_digits

    return transcribe_digits(wav.float().numpy(), rate)


def options(ctx: StageContext) -> dict[str, Any]:
    """``generate_codes`` keywords from ``generation`` (temperature 0: greedy) and ``data``'s speaker / language."""
    import torch

    from mm_pack_qwen3tts.speech import Sampling

    gen = ctx.config.generation
    sampling = Sampling(top_p=gen.top_p, temperature=gen.temperature) if gen.temperature > 0 else None
    generator = torch.Generator().manual_seed(gen.seed if gen.seed is not None else ctx.seed) if sampling else None
    return {"sampling": sampling, "sub_sampling": sampling, "generator": generator}


def slots(model: Any, speaker: str | None, language: str | None) -> dict[str, int | None]:
    from mm_pack_qwen3tts.data import Encoder

    ids = model.ids
    return {"speaker": none_if_negative(Encoder.slot(speaker, ids.spk_id, "speaker")), "language": none_if_negative(Encoder.slot(language, ids.codec_language_id, "language"))}


def none_if_negative(value: int) -> int | None:
    return None if value < 0 else value


def infer(ctx: StageContext, upstream: Mapping[str, Manifest], model: ModelSource, requests: list[Request]) -> list[dict[str, Any]]:
    """Each request's prompt spoken into ``<stage dir>/NNN.wav`` (speaker and language: ``data.speaker`` / ``data.language``)."""
    from transformers import Qwen2TokenizerFast

    from mm_pack_qwen3tts.synth import Speech
    from mm_pack_qwen3tts.speech import generate_codes
    from mmcore.data import BadRecord

    network, codec, folder = load(ctx, upstream, model)
    decode = vocoder(ctx, folder, codec)
    tokenizer = Qwen2TokenizerFast.from_pretrained(folder)
    try:
        where = slots(network, ctx.config.data.speaker, ctx.config.data.language)
    except BadRecord as exc:
        raise StageError(str(exc)) from None
    answers: list[dict[str, Any]] = []
    for i, request in enumerate(requests):
        if any(request.media.values()) or not (request.prompt or "").strip():
            answers.append({"error": "qwen3tts speaks a --prompt's text; it takes no media (voice cloning from reference audio is not implemented)"})
            continue
        ids = tokenizer(f"<|im_start|>assistant\n{request.prompt.strip()}").input_ids
        codes = generate_codes(network.talker, network.ids, ids, max_frames=ctx.config.generation.max_new_tokens, **where, **options(ctx))
        if not len(codes):
            answers.append({"error": "the talker stopped before the first frame"})
            continue
        speech = Speech(codes, decode(codes), codec.sample_rate)
        path = speech.write(ctx.stage_dir / f"{i:03d}.wav")
        seconds = round(len(codes) * codec.decoder.samples_per_frame / codec.sample_rate, 2)
        answers.append({"audio": str(path), "frames": len(codes), "seconds": seconds, "heard": heard(speech.wav, codec.sample_rate)})
    return answers


def held_out(ctx: StageContext, upstream: Mapping[str, Manifest], folder: Path) -> tuple[list[tuple[str, dict[str, Any], dict[str, Any]]], int]:
    """(name, sample, meta) of the held-out items (``evaluate.datasets``, else preprocess's eval split), and the skipped count."""
    import torch

    from mm_pack_qwen3tts.data import Encoder, read_records
    from mmcore.data import BadRecord, MediaError, ShardDataset
    from mmcore.engines import read_held_out

    if not ctx.config.evaluate.datasets:
        data = ShardDataset(upstream["preprocess"].output("dataset")).split("eval")
        return [(data.meta(i)["source"], data[i], data.meta(i)) for i in range(min(ctx.config.evaluate.limit, len(data)))], 0
    encoder = Encoder(folder, ctx.config.data.cutoff_len)

    def encode(item: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        speaker, language = encoder.slot(item.speaker, encoder.ids.spk_id, "speaker"), encoder.slot(item.language, encoder.ids.codec_language_id, "language")
        sample = {"text_ids": torch.tensor(encoder.text_ids(item.text)), "codes": encoder.codes(item.audio)}
        return sample, {"text": item.text, "audio": str(item.audio), "speaker": speaker, "language": language}

    items, skipped = read_held_out(ctx, lambda path: read_records(path, ctx.config.data), encode, (MediaError, BadRecord))
    return [(name, sample, meta) for name, (sample, meta) in items], skipped


def evaluate(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch

    from mm_pack_qwen3tts.speech import generate_codes
    from mm_pack_qwen3tts.synth import Speech
    from mm_pack_qwen3tts.train import collate
    from mmcore.engines import empty_evaluation, keep_media, write_results

    from mmcore.data import digits_wer

    network, codec, folder = load(ctx, upstream, ModelSource("export", upstream["export"].output("model")))
    decode = vocoder(ctx, folder, codec)
    items, skipped = held_out(ctx, upstream, folder)
    if not items:
        return empty_evaluation(ctx, skipped)
    rows, refs, hyps, hits, targets, sub_hits, sub_targets, exact, frames_same, first_same, frames_total = [], [], [], 0, 0, 0, 0, 0, 0, 0, 0
    for k, (name, sample, meta) in enumerate(ctx.progress(items, total=len(items), description="evaluate", unit="text")):
        batch = collate([{**sample, "speaker": meta.get("speaker", -1), "language": meta.get("language", -1)}])
        with torch.no_grad():
            out = network(batch)
        hits, targets = hits + int(out["hits"]), targets + int(out["targets"])
        sub_hits, sub_targets = sub_hits + int(out["sub_hits"]), sub_targets + int(out["sub_targets"])
        target = sample["codes"]
        where = {"speaker": none_if_negative(int(meta.get("speaker", -1))), "language": none_if_negative(int(meta.get("language", -1)))}
        codes = generate_codes(network.talker, network.ids, sample["text_ids"].tolist(), max_frames=max(ctx.config.generation.max_new_tokens, 2 * len(target)), **where, **options(ctx))
        same = int((codes[: len(target)] == target[: len(codes)]).all(-1).sum())
        first_same += int((codes[: len(target), 0] == target[: len(codes), 0]).sum())
        exact += int(codes.shape == target.shape and same == len(target))
        frames_same, frames_total = frames_same + same, frames_total + len(target)
        media = keep_media(ctx.stage_dir, [meta["audio"]]) if meta.get("audio") else []
        said = ""
        if len(codes):
            speech = Speech(codes, decode(codes), codec.sample_rate)
            wav = speech.write(ctx.stage_dir / "wavs" / f"{k:04d}.wav")
            media.append({"kind": "audio", "src": str(wav.relative_to(ctx.stage_dir))})
            said = heard(speech.wav, codec.sample_rate)
        refs.append(meta["text"])
        hyps.append(said)
        rows.append(
            {
                "item": name,
                "media": media,
                "text": meta["text"],
                "heard": said,
                "word_errors": round(digits_wer([meta["text"]], [said]) * len(meta["text"].split())),
                "target_frames": len(target),
                "generated_frames": len(codes),
                "frames_equal": same,
                "exact": same == len(target) and len(codes) == len(target),
            }
        )
    metrics = {
        "items": len(rows),
        "skipped": skipped,
        "wer": digits_wer(refs, hyps),
        "checker": "spoken digits by pitch (mmcore.data.transcribe_digits)",
        "codebook0_accuracy": hits / max(targets, 1),
        "code_predictor_accuracy": sub_hits / max(sub_targets, 1),
        "exact_match_rate": exact / len(rows),
        "frame_match_rate": frames_same / max(frames_total, 1),
        "codebook0_match_rate": first_same / max(frames_total, 1),
    }
    how = "greedy" if ctx.config.generation.temperature == 0 else f"sampled at temperature {ctx.config.generation.temperature}"
    write_results(
        ctx.stage_dir,
        rows,
        metrics,
        title=f"qwen3tts: the export {folder.name}/ speaks the held-out texts ({how}, vocoder {ctx.config.speech.vocoder})",
        columns=("item", "text", "heard", "word_errors", "target_frames", "generated_frames", "frames_equal", "exact"),
        ctx=ctx,
    )
    note = f"{len(rows)} held-out text(s), {how}, vocoder {ctx.config.speech.vocoder}: the fixed checker's WER {metrics['wer']:.1%}; codes equal to the target for {metrics['exact_match_rate']:.0%}, frames equal {metrics['frame_match_rate']:.0%}; codebook 0 alone {metrics['codebook0_match_rate']:.0%}; teacher-forced accuracy of codebook 0 {metrics['codebook0_accuracy']:.1%}, of codebooks 1-{network.talker.groups - 1} {metrics['code_predictor_accuracy']:.1%}"
    return StageResult(outputs={"results": "results.jsonl", "metrics": "metrics.json", "report": "report.html"}, metrics=metrics, notes=[note])
