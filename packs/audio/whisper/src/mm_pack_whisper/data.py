"""Whisper's side of preprocessing: transcript records, 16 kHz audio, log-mel features, labels.

Two dataset forms, JSON list or JSONL, auto-detected per file:

* transcripts: ``{"audio": "clips/a.flac", "text": "...", "language": "en"}``; the field names
  of NeMo manifests (``audio_filepath``) and Common Voice (``path``, ``sentence``) work as they
  are, and ``audio`` may be a ``{"path": ...}`` object (a datasets export).
* MLLM JSON with one ``<audio>`` per sample (``audios``); the last assistant turn is the text.

Labels are ``<|startoftranscript|> <|lang|> <|task|> <|notimestamps|> text <|endoftext|>``, the
prefix Whisper's tokenizer and ``generate()`` use; the loss covers all but the first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mmcore.data import BadSample, MediaError, BadJSON, BadRecord, load_records, media_root, read_samples, resolve_media

AUDIO_FIELDS = ("audio", "audio_filepath", "path", "file")
TEXT_FIELDS = ("text", "sentence", "transcript", "transcription")


@dataclass
class Utterance:
    file: str
    index: int
    audio: Path
    text: str
    language: str | None


def read_utterances(path: Path, cfg: Any) -> Iterator[Utterance | BadSample]:
    """Every utterance of one dataset file, or a :class:`BadSample` saying what is wrong with it."""
    records = load_records(path)
    first = next((r for r in records if isinstance(r, dict)), {})
    if cfg.columns.messages in first or "conversations" in first:
        yield from _from_conversations(path, cfg)
        return
    root = media_root(path, cfg)
    for index, record in enumerate(records):
        if isinstance(record, BadJSON):
            yield BadSample(str(path), index, str(record))
            continue
        try:
            yield _parse(path, index, record, cfg, root)
        except BadRecord as bad:
            yield BadSample(str(path), index, str(bad))


def _field(record: dict[str, Any], wanted: str, candidates: tuple[str, ...], what: str) -> Any:
    names = candidates if wanted == "auto" else (wanted,)
    for name in names:
        if name in record:
            return record[name]
    raise BadRecord(f"no {what} field (looked for {', '.join(repr(n) for n in names)})")


def _parse(path: Path, index: int, record: object, cfg: Any, root: Path) -> Utterance:
    if not isinstance(record, dict):
        raise BadRecord(f"expected an object, got {type(record).__name__}")
    audio = _field(record, cfg.fields.audio, AUDIO_FIELDS, "audio")
    if isinstance(audio, dict):
        audio = audio.get("path")
    if not isinstance(audio, str) or not audio:
        raise BadRecord("the audio field must be a path (or an object with a 'path')")
    text = _field(record, cfg.fields.text, TEXT_FIELDS, "text")
    if not isinstance(text, str) or not text.strip():
        raise BadRecord("the transcript is empty or not a string")
    language = record.get(cfg.fields.language) or cfg.language
    return Utterance(str(path), index, resolve_media(audio, root, "audio"), text.strip(), language)


def _from_conversations(path: Path, cfg: Any) -> Iterator[Utterance | BadSample]:
    for item in read_samples(path, cfg):
        if isinstance(item, BadSample):
            yield item
        elif len(item.audios) != 1 or item.images or item.videos:
            yield BadSample(item.file, item.index, f"Whisper takes exactly one <audio> and no images or videos per sample ({len(item.audios)} audio(s))")
        else:
            yield Utterance(item.file, item.index, item.audios[0], item.turns[-1].content.strip(), cfg.language)


class Encoder:
    """Audio file -> log-mel ``input_features``; transcript -> Whisper label ids."""

    def __init__(self, model_dir: Path, task: str) -> None:
        from transformers import AutoConfig, WhisperFeatureExtractor, WhisperTokenizer

        self.features = WhisperFeatureExtractor.from_pretrained(model_dir)
        self.tokenizer = WhisperTokenizer.from_pretrained(model_dir)
        self.task = task
        self.max_labels = AutoConfig.from_pretrained(model_dir).max_target_positions
        self.seconds = self.features.n_samples / self.features.sampling_rate

    def audio(self, path: Path) -> Any:
        from mmcore.data import load_audio

        samples = load_audio(path, self.features.sampling_rate)
        seconds = len(samples) / self.features.sampling_rate
        if seconds > self.seconds:
            raise MediaError(f"audio {path} is {seconds:.1f} s, longer than the model's {self.seconds:g} s window (split it)")
        return samples

    def input_features(self, samples: Any) -> Any:
        import torch

        out = self.features(samples, sampling_rate=self.features.sampling_rate, return_tensors="np")
        return torch.from_numpy(out["input_features"][0]).float()

    def labels(self, text: str, language: str | None) -> list[int]:
        # set_prefix_tokens keeps the previous language when given None: set it outright.
        self.tokenizer.language = language
        try:
            self.tokenizer.set_prefix_tokens(task=self.task, predict_timestamps=False)
        except ValueError:
            raise BadRecord(f"language {language!r} is not one Whisper knows (use a code like 'en' or a name like 'english')") from None
        ids = self.tokenizer(text).input_ids
        if len(ids) > self.max_labels:
            raise BadRecord(f"transcript is {len(ids)} tokens, more than the decoder's {self.max_labels} positions")
        return ids

    def prefix_length(self, labels: list[int]) -> int:
        """Tokens up to and including <|notimestamps|>: what generate() forces before the text."""
        return labels.index(self.tokenizer.convert_tokens_to_ids("<|notimestamps|>")) + 1
