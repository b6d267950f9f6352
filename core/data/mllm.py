"""The MLLM JSON format of LLaMA-Factory and MindSpeed-MM, read as it is found in the wild.

A dataset file is a JSON list (or JSONL) of samples like::

    {"messages": [{"role": "user", "content": "<image>Who are they?"},
                  {"role": "assistant", "content": "..."}],
     "images": ["dir/1.jpg"]}

``videos`` go with ``<video>``, ``audios`` with ``<audio>``; several placeholders per sample,
multi-turn, optional leading system turn, text-only samples mixed in. Media paths are relative
to the dataset file's folder (or ``media_dir``). Field names are remappable; ShareGPT's
``conversations``/``from``/``value`` with ``human``/``gpt`` is recognised by itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal

from pydantic import Field

from mmcore.config import DataSection, Section
from mmcore.data.badsamples import BadSample
from mmcore.errors import StageError

PLACEHOLDERS = {"images": "<image>", "videos": "<video>", "audios": "<audio>"}


class Columns(Section):
    """Field names of a dataset (LLaMA-Factory's ``columns`` and ``tags``)."""

    messages: str = Field("messages", description="The field holding the conversation (a list of turns); ShareGPT files: conversations.")
    images: str = Field("images", description="The field listing a sample's image paths (relative to the dataset file).")
    videos: str = Field("videos", description="The field listing a sample's video paths.")
    audios: str = Field("audios", description="The field listing a sample's audio paths.")
    system: str | None = Field("system", description="Top-level system prompt field, if any.")
    role: str = Field("role", description="The field of a turn that says who speaks; ShareGPT: from.")
    content: str = Field("content", description="The field of a turn holding its text; ShareGPT: value.")
    user_tag: str = Field("user", description="The role value of the user's turns; ShareGPT: human.")
    assistant_tag: str = Field("assistant", description="The role value of the model's turns (the ones trained on); ShareGPT: gpt.")
    system_tag: str = Field("system", description="The role value of a system turn.")


SHAREGPT = Columns(messages="conversations", role="from", content="value", user_tag="human", assistant_tag="gpt")


class MLLMDataSection(DataSection):
    """Data options every pack reading MLLM JSON shares."""

    format: Literal["auto", "messages", "sharegpt"] = Field("auto", description="auto: messages or ShareGPT, per file.")
    columns: Columns = Field(default_factory=Columns)
    media_dir: str | None = Field(None, description="Folder media paths are relative to (default: each dataset file's folder).")
    cutoff_len: int = Field(2048, ge=16, description="Longest tokenized sample; longer text is cut, cut media is a bad sample.")
    train_on_prompt: bool = Field(False, description="Also compute the loss on user turns.")
    eval_fraction: float = Field(0.0, ge=0, lt=1, description="Fraction of samples held out for evaluation.")
    # read by mmcore.data.conversations, so declared here rather than by every pack
    eval_datasets: list[str] = Field(default_factory=list, description="Held-out datasets (MLLM JSON) for evaluation.")
    demo_samples: int = Field(0, ge=0, description="Without data.datasets, generate the pack's synthetic demo dataset with this many samples (ignored when datasets are given).")
    ranking: bool = Field(False, description="The datasets are preference pairs (a prompt with chosen and rejected answers; LLaMA-Factory's ranking: true), for training.method: dpo.")


@dataclass
class Turn:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass
class Sample:
    file: str
    index: int
    turns: list[Turn]
    media: dict[str, list[Path]] = field(default_factory=dict)  # "images"/"videos"/"audios" -> files

    @property
    def images(self) -> list[Path]:
        return self.media.get("images", [])

    @property
    def videos(self) -> list[Path]:
        return self.media.get("videos", [])

    @property
    def audios(self) -> list[Path]:
        return self.media.get("audios", [])

    @property
    def asks_for_picture(self) -> bool:
        """A text -> picture sample: its last turn is the assistant's and is ``<image>`` alone
        (LLaMA-Factory's MLLM JSON as it is; Janus, Lumina-mGPT and BAGEL train on it, SDK 1.31)."""
        return bool(self.turns) and self.turns[-1].role == "assistant" and self.turns[-1].content.strip() == "<image>"


class BadJSON:
    """A JSONL line that does not parse: one bad sample, not a bad file."""

    def __init__(self, line: int, message: str) -> None:
        self.line, self.message = line, message

    def __str__(self) -> str:
        return f"line {self.line}: invalid JSON: {self.message}"


def load_records(path: Path) -> list[object]:
    """The records of a JSON list or JSONL file. An unreadable, non-UTF-8, malformed or empty
    file is a one-line error naming it; in JSONL, a line that does not parse is a
    :class:`BadJSON` record (one bad sample, reported with its line number)."""
    if path.is_dir():
        raise StageError(f"{path}: is a directory; this pack reads a dataset file (JSON list or JSONL)")
    if not path.is_file():
        raise StageError(f"{path}: dataset file not found")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise StageError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save the dataset as UTF-8") from None
    except OSError as exc:
        raise StageError(f"{path}: cannot read the dataset file ({exc.strerror or exc})") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StageError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
        if not isinstance(data, list):
            raise StageError(f"{path}: expected a list of samples, got {type(data).__name__}")
    else:
        try:
            whole: object = json.loads(text)
        except json.JSONDecodeError:
            whole = BadJSON  # not one JSON document: JSONL
        if isinstance(whole, dict):
            data = [whole]  # a single sample
        elif whole is not BadJSON:
            raise StageError(f"{path}: expected a list of samples, got {type(whole).__name__}")
        else:
            data = []
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    data.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    data.append(BadJSON(number, exc.msg))
            if data and all(isinstance(r, BadJSON) for r in data):
                first = data[0]
                raise StageError(f"{path}:{first.line}: invalid JSON: {first.message} (neither a JSON list nor JSONL)")  # type: ignore[union-attr]
    if not data:
        raise StageError(f"{path}: the dataset holds no samples")
    return data


def _columns_for(records: list[object], section: MLLMDataSection) -> Columns:
    if section.format == "sharegpt":
        return SHAREGPT
    if section.format == "auto" and section.columns == Columns():
        first = next((r for r in records if isinstance(r, dict)), {})
        if "conversations" in first and "messages" not in first:
            return SHAREGPT
    return section.columns


def open_records(path: Path, section: MLLMDataSection) -> tuple[list[object], Columns, dict[str, str], Path]:
    """(the file's records, its field names, role tag -> role, the folder its media are under)."""
    records = load_records(path)
    columns = _columns_for(records, section)
    roles = {columns.user_tag: "user", columns.assistant_tag: "assistant", columns.system_tag: "system"}
    return records, columns, roles, media_root(path, section)


def read_samples(path: Path, section: MLLMDataSection) -> Iterator[Sample | BadSample]:
    """Every sample of one dataset file, or a :class:`BadSample` saying what is wrong with it."""
    records, columns, roles, root = open_records(path, section)
    for index, record in enumerate(records):
        if isinstance(record, BadJSON):
            yield BadSample(str(path), index, str(record))
            continue
        try:
            yield _parse(path, index, record, columns, roles, root)
        except BadRecord as bad:
            yield BadSample(str(path), index, str(bad))


class BadRecord(Exception):
    """What is wrong with one record (becomes a :class:`BadSample` naming file and index)."""


def resolve_media(name: str, media_root: Path, kind: str) -> Path:
    """``name`` relative to ``media_root``, which it may not escape, and which must exist."""
    if "\0" in name:
        raise BadRecord(f"{kind} path {name!r} contains a NUL byte")
    candidate = (media_root / name).resolve()
    if not candidate.is_relative_to(media_root):
        raise BadRecord(f"{kind} path {name!r} escapes the dataset folder {media_root}")
    if not candidate.is_file():
        raise BadRecord(f"{kind} file not found: {candidate}")
    return candidate


def media_root(path: Path, section: "MLLMDataSection | DataSection") -> Path:
    """The folder media paths of dataset file ``path`` are relative to."""
    media_dir = getattr(section, "media_dir", None)
    return (Path(media_dir) if media_dir else path.parent).resolve()


def _parse(path: Path, index: int, record: object, columns: Columns, roles: dict[str, str], media_root: Path) -> Sample:
    if not isinstance(record, dict):
        raise BadRecord(f"expected an object, got {type(record).__name__}")
    messages = record.get(columns.messages)
    if not isinstance(messages, list) or not messages:
        raise BadRecord(f"field {columns.messages!r} is missing or not a non-empty list")
    turns: list[Turn] = []
    system = record.get(columns.system) if columns.system else None
    if isinstance(system, str) and system:
        turns.append(Turn("system", system))
    for number, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRecord(f"message {number} is not an object")
        role = roles.get(str(message.get(columns.role)))
        content = message.get(columns.content)
        if role is None:
            raise BadRecord(f"message {number} has role {message.get(columns.role)!r}, expected {columns.user_tag!r} or {columns.assistant_tag!r}")
        if not isinstance(content, str):
            raise BadRecord(f"message {number} has no text {columns.content!r}")
        turns.append(Turn(role, content))  # type: ignore[arg-type]
    if [i for i, t in enumerate(turns) if t.role == "system"] not in ([], [0]):
        raise BadRecord("a system message may only come first, once")
    dialogue = turns[1:] if turns[0].role == "system" else turns
    if not dialogue:
        raise BadRecord("no user/assistant turns")
    for number, turn in enumerate(dialogue):
        expected = "user" if number % 2 == 0 else "assistant"
        if turn.role != expected:
            raise BadRecord(f"turn {number} is from {turn.role}, expected {expected} (turns alternate, user first)")
    reference = next((record[key] for key in ("answer", "solution") if isinstance(record.get(key), str) and record[key].strip()), None)
    if dialogue[-1].role == "user" and reference is not None:  # an RL prompt's reference (verl / ms-swift GRPO files)
        turns.append(Turn("assistant", reference))
        dialogue = [*dialogue, turns[-1]]
    if dialogue[-1].role != "assistant":
        raise BadRecord("the last turn must be the assistant's (or give the reference answer as 'answer' or 'solution')")
    media: dict[str, list[Path]] = {}
    text = "".join(t.content for t in turns)
    for kind, placeholder in PLACEHOLDERS.items():
        files = record.get(getattr(columns, kind)) or []
        if isinstance(files, str):
            files = [files]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise BadRecord(f"field {getattr(columns, kind)!r} must be a list of paths")
        count = text.count(placeholder)
        if count != len(files):
            raise BadRecord(f"{count} {placeholder} placeholder(s) but {len(files)} {kind}")
        resolved = [resolve_media(name, media_root, kind[:-1]) for name in files]
        if resolved:
            media[kind] = resolved
    return Sample(str(path), index, turns, media)
