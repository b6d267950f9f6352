"""Preprocess: ``{"audio", "text"}`` records -> text ids, speech tokens, mel and speaker vector, in shards.

Per record (CosyVoice's ``tokenize`` / ``compute_fbank`` / ``parse_embedding`` steps): the text
through the folder's Qwen2 tokenizer (``CosyVoice-BlankEN``); the audio at the yaml's sample rate,
zero-padded to whole speech tokens; its 80-bin log mel (:func:`~mm_pack_cosyvoice3.features.
log_mel`); its speech tokens, from the record's ``speech_token`` when given (ids the public S3
tokenizer gave offline) else from the folder's tokenizer (the demo's); the speaker embedding from
the record's ``embedding`` (normalised by the flow, as the reference) else zeros (no CAM++ speaker
model runs here). Bad records and media stop the stage in one line, or are counted and listed
with ``data.on_bad_sample: skip``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from mmcore import Manifest, StageContext, StageError, StageResult
from mmcore.data import BadRecord, BadSample, BadSamples, Failed, MediaError, ShardWriter, held_out, map_in_order, read_spoken_texts


@dataclass
class Utterance:
    file: str
    index: int
    audio: Path
    text: str
    speech_token: list[int] | None
    embedding: list[float] | None


def read_utterances(path: Path, cfg: Any) -> Iterator[Utterance | BadSample]:
    """The records (:func:`mmcore.data.read_spoken_texts`), with their optional ``speech_token`` and ``embedding``."""
    for item in read_spoken_texts(path, cfg):
        if isinstance(item, BadSample):
            yield item
            continue
        tokens, emb = item.record.get("speech_token"), item.record.get("embedding")
        if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, int) and t >= 0 for t in tokens) and tokens):
            yield BadSample(item.file, item.index, "'speech_token' must be a non-empty list of ids")
            continue
        yield Utterance(item.file, item.index, item.audio, item.text, tokens, emb)


class Encoder:
    """One folder's text tokenizer, feature settings and speech tokenizer."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        from mm_pack_cosyvoice3.features import speech_tokenizer
        from mm_pack_cosyvoice3.model import QWEN_DIR, read_configs

        self.cfg, _ = read_configs(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(Path(model_dir) / QWEN_DIR)
        self.speech_tokenizer = speech_tokenizer(model_dir, self.cfg.mel, self.cfg.token_frame_rate)

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, item: Utterance) -> dict[str, Any]:
        import torch

        from mmcore.data import load_audio

        from mm_pack_cosyvoice3.features import log_mel, pad_to_tokens

        cfg = self.cfg
        wav = pad_to_tokens(load_audio(item.audio, cfg.sample_rate), cfg.sample_rate, cfg.token_frame_rate)
        if len(wav) == 0:
            raise MediaError(f"{item.audio}: no samples")
        if item.speech_token is not None:
            tokens = item.speech_token
        elif self.speech_tokenizer is not None:
            tokens = self.speech_tokenizer(wav)
        else:
            raise StageError("this checkpoint has no speech tokenizer this pack runs (the public speech_tokenizer_v3.onnx needs onnxruntime): give each record its 'speech_token' ids")
        if max(tokens) >= cfg.lm.speech_token_size:
            raise BadRecord(f"speech token {max(tokens)} >= speech_token_size {cfg.lm.speech_token_size}")
        ids = self.text_ids(item.text)
        if not ids:
            raise BadRecord("the text tokenizes to nothing")
        dim = cfg.flow.spk_embed_dim
        emb = torch.zeros(dim) if item.embedding is None else torch.tensor(item.embedding, dtype=torch.float32)
        if emb.shape != (dim,):
            raise BadRecord(f"'embedding' has {emb.numel()} values, the flow takes {dim}")
        return {"text": torch.tensor(ids), "speech_token": torch.tensor(tokens), "speech_feat": log_mel(wav, cfg.mel), "embedding": emb, "seconds": len(wav) / cfg.sample_rate}


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from mmcore.data import dataset_files, media_limits
    from mmcore.train import refuse_fewer_than_a_step

    from mm_pack_cosyvoice3.demo import write_demo_dataset

    cfg = ctx.config.data
    media_limits(cfg)
    encoder = Encoder(Path(upstream["download"].output("model")))
    train_files, eval_files = dataset_files(ctx, write_demo_dataset, 'JSON/JSONL records {"audio": ..., "text": ...}')
    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    counts, seconds = {"train": 0, "eval": 0}, 0.0
    for path, split in [(p, "train") for p in train_files] + [(p, "eval") for p in eval_files]:
        items = list(read_utterances(path, cfg))
        encoded = map_in_order(encoder.encode, items, cfg.num_workers, errors=(MediaError, BadRecord), passes=lambda item: isinstance(item, BadSample))
        for item, result in ctx.progress(encoded, total=len(items), description=f"preprocess {path.name}", unit="clip"):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            if isinstance(result, Failed):
                bad.report(BadSample(item.file, item.index, str(result)))
                continue
            this = "eval" if split == "train" and cfg.eval_fraction and held_out(f"{item.file}:{item.index}", cfg.eval_fraction) else split
            seconds += result.pop("seconds")
            meta = {"split": this, "source": f"{Path(item.file).name}:{item.index}", "audio": str(item.audio), "text": item.text}
            writer.add(result, length=len(result["text"]) + len(result["speech_token"]), meta=meta)
            counts[this] += 1
    skipped = bad.close()
    if counts["train"] == 0:
        raise StageError("no usable training clips" + (f" ({skipped})" if skipped else ""))
    refuse_fewer_than_a_step(ctx.config, counts["train"], "clips")
    writer.close(sample_rate=encoder.cfg.sample_rate)
    notes = [f"{counts['train']} train / {counts['eval']} eval clips, {seconds / 60:.1f} min of audio; speaker embeddings: zeros unless a record gives one"]
    if skipped:
        notes.append(skipped)
    return StageResult(
        outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"},
        metrics={"train_samples": counts["train"], "eval_samples": counts["eval"], "skipped": len(bad.found), "audio_seconds": round(seconds, 3)},
        notes=notes,
    )
