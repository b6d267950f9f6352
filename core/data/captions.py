"""Caption datasets for generative packs, as MindSpeed-MM and most trainers lay them out.

* Caption JSON (or JSONL): ``[{"path": "videos/x.mp4", "cap": "...", "num_frames": 81, "fps": 24,
  "resolution": {"height": 480, "width": 832}}]``; ``cap`` may be a list (one is used per sample).
  Paths are relative to the JSON file's folder.
* A folder of videos/images, each with a ``.txt`` caption beside it (``clip.mp4`` + ``clip.txt``).
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
