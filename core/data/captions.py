"""Caption datasets for generative packs, as MindSpeed-MM and most trainers lay them out.

* Caption JSON (or JSONL): ``[{"path": "videos/x.mp4", "cap": "...", "num_frames": 81, "fps": 24,
  "resolution": {"height": 480, "width": 832}}]``; ``cap`` may be a list (one is used per sample).
  Paths are relative to the JSON file's folder.
* A folder of videos/images, each with a ``.txt`` caption beside it (``clip.mp4`` + ``clip.txt``).
* Preference pairs (``data.ranking``, for DPO): caption JSON whose records name two videos of
  one caption, ``[{"cap": "...", "chosen": "videos/w.mp4", "rejected": "videos/l.mp4"}]``
  (the preferred one first), paths relative to the JSON file's folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from mmcore.data.badsamples import BadSample
from mmcore.data.mllm import BadJSON, load_records
from mmcore.data.video import IMAGE_SUFFIXES

VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm"}


@dataclass
class CaptionItem:
    file: str
    index: int
    media: Path
    caption: str


def read_captions(dataset: Path) -> Iterator[CaptionItem | BadSample]:
    if dataset.is_dir():
        yield from _folder(dataset)
        return
    root = dataset.parent.resolve()
    for index, record in enumerate(load_records(dataset)):
        if isinstance(record, BadJSON):
            yield BadSample(str(dataset), index, str(record))
            continue
        if not isinstance(record, dict):
            yield BadSample(str(dataset), index, f"expected an object, got {type(record).__name__}")
            continue
        path, cap = record.get("path"), record.get("cap", record.get("caption"))
        if isinstance(cap, list):
            cap = cap[0] if cap else None
        if not isinstance(path, str) or not isinstance(cap, str):
            yield BadSample(str(dataset), index, "needs a string 'path' and a caption 'cap'")
            continue
        if "\0" in path:
            yield BadSample(str(dataset), index, f"path {path!r} contains a NUL byte")
            continue
        media = (root / path).resolve()
        if not media.is_relative_to(root):
            yield BadSample(str(dataset), index, f"path {path!r} escapes the dataset folder {root}")
        elif not media.is_file():
            yield BadSample(str(dataset), index, f"file not found: {media}")
        else:
            yield CaptionItem(str(dataset), index, media, cap)


@dataclass
class CaptionPair:
    file: str
    index: int
    chosen: Path
    rejected: Path
    caption: str


def _media(root: Path, path: object, field: str) -> Path | str:
    """The file ``path`` names under ``root``, or what is wrong with it."""
    if not isinstance(path, str) or not path:
        return f"needs a string {field!r} path"
    if "\0" in path:
        return f"{field} path {path!r} contains a NUL byte"
    media = (root / path).resolve()
    if not media.is_relative_to(root):
        return f"{field} path {path!r} escapes the dataset folder {root}"
    if not media.is_file():
        return f"{field} file not found: {media}"
    return media


def read_caption_pairs(dataset: Path) -> Iterator[CaptionPair | BadSample]:
    """The preference pairs of a caption JSON file (see the module's docs)."""
    if dataset.is_dir():
        yield BadSample(str(dataset), 0, "preference pairs come as caption JSON with 'chosen' and 'rejected' paths, not a folder")
        return
    root = dataset.parent.resolve()
    for index, record in enumerate(load_records(dataset)):
        if isinstance(record, BadJSON) or not isinstance(record, dict):
            yield BadSample(str(dataset), index, str(record) if isinstance(record, BadJSON) else f"expected an object, got {type(record).__name__}")
            continue
        cap = record.get("cap", record.get("caption", record.get("prompt")))
        if isinstance(cap, list):
            cap = cap[0] if cap else None
        if not isinstance(cap, str) or not cap.strip():
            yield BadSample(str(dataset), index, "needs a caption 'cap'")
            continue
        found = [_media(root, record.get(field), field) for field in ("chosen", "rejected")]
        problem = next((f for f in found if isinstance(f, str)), None)
        if problem is None and found[0] == found[1]:
            problem = "chosen and rejected are the same file"
        if problem is not None:
            yield BadSample(str(dataset), index, problem)
            continue
        yield CaptionPair(str(dataset), index, found[0], found[1], cap)  # type: ignore[arg-type]


def _folder(folder: Path) -> Iterator[CaptionItem | BadSample]:
    media = sorted(p for p in folder.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES | IMAGE_SUFFIXES)
    for index, path in enumerate(media):
        caption = path.with_suffix(".txt")
        if not caption.is_file():
            yield BadSample(str(folder), index, f"{path.name} has no caption file {caption.name}")
            continue
        try:
            text = caption.read_bytes().decode("utf-8-sig").strip()
        except UnicodeDecodeError as exc:
            yield BadSample(str(folder), index, f"caption {caption.name} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})")
            continue
        if not text:
            yield BadSample(str(folder), index, f"caption {caption.name} is empty")
            continue
        yield CaptionItem(str(folder), index, path, text)
