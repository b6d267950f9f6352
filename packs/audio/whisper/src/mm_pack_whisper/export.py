"""Export: the trained checkpoint as a folder ``from_pretrained`` and the ASR pipeline load.

After writing, the export reloads with plain transformers and compares logits with the model
built from the training checkpoint; then ``pipeline("automatic-speech-recognition")``
transcribes the held-out audio files from disk, and its text is compared with the trained
model's own greedy transcripts and with the references (WER).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Mapping

from mmcore import StageContext, StageResult, Manifest


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from mm_pack_whisper.adapter import ADAPTER
    from mm_pack_whisper.model import build_model, collate, forward
    from mmcore.data import ShardDataset
    from mmcore.engines import export_checked

    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held_out = data.split("eval")
    probe = held_out if len(held_out) else data
    done = export_checked(
        ctx,
        upstream,
        ADAPTER,
        build_trained=build_model,
        load_exported=load_exported,
        probe=collate([probe[i] for i in range(min(4, len(probe)))], int(data.index["eos_id"])),
        logits=lambda model, batch: forward(model, batch).logits,
    )
    if len(held_out):
        loaded = done.loaded if done.adapter == done.folder else None
        # The pipeline loads the folder itself; the reloaded copy would be a third model in memory
        # beside the trained one and the pipeline's, and it made export the run's peak RSS.
        done.loaded = None
        gc.collect()  # a transformers model holds reference cycles: freed only by the collector
        agreement, wer = pipeline_check(ctx, done.folder, done.trained, held_out, data.index, loaded=loaded)
        done.metrics.update(pipeline_agreement=agreement, pipeline_wer=wer)
        done.notes.append(f"pipeline('automatic-speech-recognition') on the held-out audio files: WER {wer:.1%}, same text as the trained model's generate() for {agreement:.0%} of clips")
    return StageResult(outputs=done.outputs, metrics=done.metrics, notes=done.notes)


def load_exported(folder: Path) -> Any:
    """The export (or a LoRA adapter folder on its base) with transformers."""
    from transformers import WhisperForConditionalGeneration

    from mmcore.train import with_adapters

    return with_adapters(lambda path: WhisperForConditionalGeneration.from_pretrained(path, attn_implementation="sdpa"))(folder)


def pipeline_check(ctx: StageContext, folder: Path, trained: Any, held_out: Any, index: dict[str, Any], limit: int = 32, loaded: Any = None) -> tuple[float, float]:
    """(share of clips where the pipeline's text equals the trained model's ``generate()``, the
    pipeline's WER). The pipeline reads the audio files itself; the trained model gets the
    preprocessed features. The pipeline loads ``folder``, or takes ``loaded`` (an adapter on
    its base) with the folder's tokenizer and feature extractor."""
    import torch
    from transformers import GenerationConfig, WhisperTokenizer, pipeline
    from transformers.utils import logging as hf_logging

    from mmcore.data import load_audio
    from mmcore.engines import word_errors

    hf_logging.set_verbosity_error()  # generate() warns about every config it merges: noise here
    if loaded is None:
        asr = pipeline("automatic-speech-recognition", model=str(folder), device="cpu")
    else:
        from transformers import WhisperFeatureExtractor

        asr = pipeline(
            "automatic-speech-recognition", model=loaded, tokenizer=WhisperTokenizer.from_pretrained(folder), feature_extractor=WhisperFeatureExtractor.from_pretrained(folder), device="cpu"
        )
    tokenizer = WhisperTokenizer.from_pretrained(folder)
    trained.generation_config = GenerationConfig.from_pretrained(folder)
    rate, task = int(index["sampling_rate"]), index["task"]
    same = errors = words = 0
    count = min(limit, len(held_out))
    for i in ctx.progress(range(count), description="export: pipeline", unit="clip"):
        meta = held_out.meta(i)
        # Greedy (the pipeline's default is 5 beams), and long enough for the reference twice over (an untrained model rambles).
        kwargs = {"task": task, "num_beams": 1, "max_length": min(meta["prefix"] + 2 * held_out.length(i) + 4, trained.config.max_target_positions)}
        if meta["language"]:
            kwargs["language"] = meta["language"]
        text = asr({"raw": load_audio(Path(meta["audio"]), rate), "sampling_rate": rate}, generate_kwargs=kwargs)["text"]
        with torch.no_grad():
            tokens = trained.generate(held_out[i]["input_features"][None], **kwargs)[0]
        same += int(text.strip() == tokenizer.decode(tokens, skip_special_tokens=True).strip())
        e, n = word_errors(meta["text"], text)
        errors, words = errors + e, words + n
    return same / count, errors / max(words, 1)
