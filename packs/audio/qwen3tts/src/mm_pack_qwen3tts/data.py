"""Preprocess: ``{"audio": wav, "text": "...", "speaker"?: name, "language"?: name}`` records
(JSON list or JSONL) -> text ids and target codes in shards, train and held-out splits.

The records are the reference's fine-tuning input (``finetuning/prepare_data.py`` reads
``audio`` and ``text`` and adds ``audio_codes``; its ``ref_audio`` feeds the Base models'
speaker encoder, whose mel front end the pack does not have: such a record is a bad sample).
Text ids are the tokenised ``<|im_start|>assistant\\n{text}`` (the reference's
``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`` less its last 5 ids);
target codes are the speech tokenizer encoder's (:mod:`mm_pack_qwen3tts.encoder`) for the clip
decoded at 24 kHz. A CustomVoice ``speaker`` is a name of ``spk_id``, a ``language`` one of
``codec_language_id`` (defaults ``data.speaker`` / ``data.language``; none: no slot, the
reference's "auto").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from mmcore import Manifest, StageContext, StageError, StageResult
from mmcore.data import BadRecord, BadSample, BadSamples, Failed, MediaError, ShardWriter, held_out, map_in_order, read_spoken_texts

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass
class Record:
    file: str
    index: int
    audio: Path
    text: str
    speaker: str | None
    language: str | None


def read_records(path: Path, cfg: Any) -> Iterator[Record | BadSample]:
    """The records (:func:`mmcore.data.read_spoken_texts`), with their ``speaker`` and ``language``."""
    for item in read_spoken_texts(path, cfg):
        if isinstance(item, BadSample):
            yield item
        elif item.record.get("ref_audio"):
            yield BadSample(item.file, item.index, "'ref_audio' (a Base model's speaker prompt) is not supported: the speaker encoder's mel front end is not implemented")
        else:
            yield Record(item.file, item.index, item.audio, item.text, item.record.get("speaker") or cfg.speaker, item.record.get("language") or cfg.language)


class Encoder:
    """Text -> ids (the checkpoint's Qwen2 tokenizer), audio -> codes (its speech tokenizer)."""

    def __init__(self, model_dir: Path, limit: int) -> None:
        from transformers import Qwen2TokenizerFast

        from mm_pack_qwen3tts.config import read_config, special_ids
        from mm_pack_qwen3tts.model import load_speech_encoder

        self.tokenizer = Qwen2TokenizerFast.from_pretrained(model_dir)
        cfg = read_config(model_dir)
        self.ids, self.im_start = special_ids(cfg), int(cfg.get("im_start_token_id", 151644))
        self.codec = load_speech_encoder(model_dir)
        self.limit = limit

    def text_ids(self, text: str) -> list[int]:
        ids = self.tokenizer(f"<|im_start|>assistant\n{text}").input_ids
        if ids[0] != self.im_start:
            raise StageError(f"the tokenizer's <|im_start|> is {ids[0]}, the config's im_start_token_id {self.im_start}")
        return ids

    @staticmethod
    def slot(name: str | None, table: Mapping[str, int], what: str) -> int:
        if name is None:
            return -1
        if name.lower() not in table:
            raise BadRecord(f"{what} {name!r} is not one of this checkpoint's: {', '.join(sorted(table)) or 'none'}")
        return table[name.lower()]

    def codes(self, path: Path) -> Any:
        from mmcore.data import load_audio
        import torch

        samples = load_audio(path, self.codec.sample_rate)
        if len(samples) < self.codec.samples_per_frame:
            raise MediaError(f"audio {path} is {len(samples)} samples, shorter than one {self.codec.samples_per_frame}-sample frame")
        return self.codec.encode(torch.from_numpy(samples).float())


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch

    from mmcore.data import dataset_files, media_limits
    from mmcore.train import refuse_fewer_than_a_step

    cfg = ctx.config.data
    media_limits(cfg)
    encoder = Encoder(upstream["download"].output("model"), cfg.cutoff_len)
    train_files, eval_files = dataset_files(ctx, write_demo_dataset, 'JSON/JSONL records {"audio": ..., "text": ...}')
    bad = BadSamples(cfg.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    writer = ShardWriter(ctx.stage_dir / "dataset")
    counts, frames = {"train": 0, "eval": 0}, 0

    def encode(item: Record) -> tuple[list[int], int, int, Any]:
        speaker = encoder.slot(item.speaker, encoder.ids.spk_id, "speaker")
        language = encoder.slot(item.language, encoder.ids.codec_language_id, "language")
        ids = encoder.text_ids(item.text)
        codes = encoder.codes(item.audio)
        length = len(ids) + len(codes) + 10  # the layout: role, think prefix, speaker, text, eos, bos, frames, eos
        if length > encoder.limit:
            raise BadRecord(f"text and audio make {length} positions, more than data.cutoff_len {encoder.limit}")
        return ids, speaker, language, codes

    for path, split in [(p, "train") for p in train_files] + [(p, "eval") for p in eval_files]:
        items = list(read_records(path, cfg))
        encoded = map_in_order(encode, items, 1, errors=(MediaError, BadRecord), passes=lambda item: isinstance(item, BadSample))
        for item, result in ctx.progress(encoded, total=len(items), description=f"preprocess {path.name}", unit="clip"):
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            if isinstance(result, Failed):
                bad.report(BadSample(item.file, item.index, str(result)))
                continue
            ids, speaker, language, codes = result
            this = "eval" if split == "train" and cfg.eval_fraction and held_out(f"{item.file}:{item.index}", cfg.eval_fraction) else split
            meta = {"split": this, "source": f"{Path(item.file).name}:{item.index}", "audio": str(item.audio), "text": item.text, "speaker": speaker, "language": language}
            writer.add({"text_ids": torch.tensor(ids), "codes": codes}, length=len(ids) + len(codes), meta=meta)
            counts[this] += 1
            frames += len(codes)
    skipped = bad.close()
    if counts["train"] == 0:
        raise StageError("no usable training clips" + (f" ({skipped})" if skipped else ""))
    refuse_fewer_than_a_step(ctx.config, counts["train"], "clips")
    writer.close(num_code_groups=encoder.ids.num_code_groups)
    notes = [f"{counts['train']} train / {counts['eval']} eval clips, {frames} frames of codes ({frames / 12.5 / 60:.1f} min)"]
    return StageResult(
        outputs={"dataset": "dataset", "bad_samples": "bad_samples.jsonl"},
        metrics={"train_samples": counts["train"], "eval_samples": counts["eval"], "skipped": len(bad.found), "frames": frames},
        notes=notes + ([skipped] if skipped else []),
    )


def write_demo_dataset(folder: Path, samples: int, seed: int, eval_fraction: float = 0.1) -> tuple[Path, Path]:
    """Synthetic 24 kHz clips (``train.jsonl``, ``eval.jsonl``) of one to three digit names: the
    demo's chord syllables (:func:`mm_pack_qwen3tts.demo.digits_wave`), each on whole codec
    frames. No held-out text occurs in training, so evaluate hears texts the talker never saw."""
    import numpy as np

    from mm_pack_qwen3tts.demo import digits_wave, random_digits
    from mmcore.data import write_audio

    rng = np.random.default_rng(seed)
    cut = int(samples * (1 - eval_fraction))
    records: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(records) < samples:
        digits = random_digits(rng)
        text = " ".join(WORDS[d] for d in digits)
        if len(records) >= cut and text in seen and len(seen) < 1110:  # 10 + 100 + 1000 texts exist
            continue
        if len(records) < cut:
            seen.add(text)
        name = f"clips/{len(records):05d}.wav"
        write_audio(folder / name, digits_wave(digits), 24000)
        records.append({"audio": name, "text": text})
    train, held = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records[:cut]))
    held.write_text("".join(json.dumps(r) + "\n" for r in records[cut:]))
    return train, held
