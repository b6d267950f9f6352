"""ChatML conversations -> token ids and labels, with media placeholders expanded by the pack.

The Qwen families (Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni, ...) format every turn as
``<|im_start|>role\\n ... <|im_end|>\\n``; only what differs per model is how a placeholder
(``<image>``, ``<video>``, ``<audio>``) becomes tokens and tensors. A pack hands
:class:`ChatMLEncoder` one *expander* per placeholder; an expander reads one media file and
returns its token ids and the arrays to store, which the encoder gathers per field name in
order of appearance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable

from mmcore.data.mllm import PLACEHOLDERS, Sample

IGNORE = -100


@dataclass
class Piece:
    """One media item as the model sees it: its tokens and its arrays (per field name)."""

    ids: list[int]
    fields: dict[str, Any] = field(default_factory=dict)


Expander = Callable[[Path], Piece]


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    fields: dict[str, list[Any]]  # field name -> one array per media item, in order

    @cached_property
    def tensors(self) -> dict[str, Any]:
        """The media fields as the model takes them: patches and frames (``pixel_values*``,
        ``input_features``) concatenated, grids and lengths (``*_grid_thw``, ``*_lengths``)
        as long rows, anything else as float values."""
        import numpy as np
        import torch

        out: dict[str, Any] = {}
        for name, items in self.fields.items():
            if name.startswith("pixel_values") or name == "input_features":
                # items join along their first axis (patches, frames); every other axis must agree,
                # or np.concatenate would fail late or, for 1-d items, mix values silently
                shapes = sorted({tuple(np.shape(item)) for item in items})
                if any(len(shape) < 2 for shape in shapes) or len({shape[1:] for shape in shapes}) > 1:
                    raise ValueError(f"media field {name!r}: items of shapes {shapes} cannot be joined (each needs the same shape after its first axis)")
                out[name] = torch.from_numpy(np.concatenate(items)).float()
            elif name.endswith(("_grid_thw", "_lengths")):
                out[name] = torch.tensor([v for item in items for v in item], dtype=torch.long)
            else:
                out[name] = torch.tensor([v for item in items for v in item], dtype=torch.float32)
        return out


class ChatMLEncoder:
    """Encodes :class:`~mmcore.data.mllm.Sample` turns; labels cover assistant turns (and their
    ``<|im_end|>``), or user turns too with ``train_on_prompt``.

    Args:
        tokenizer: the model's tokenizer (with ``<|im_start|>``/``<|im_end|>``).
        expanders: placeholder (``"<image>"``) -> function from a media file to a :class:`Piece`.
        default_system: the system prompt of samples that bring none (None: no system turn).
        train_on_prompt: also supervise user turns.
        media_token_ids: tokens that belong to media; truncation may not cut through them.
    """

    def __init__(self, tokenizer: Any, expanders: dict[str, Expander], *, default_system: str | None,
                 train_on_prompt: bool = False, media_token_ids: Iterable[int] = ()) -> None:
        self.tok = tokenizer
        self.expanders = expanders
        self.default_system = default_system
        self.train_on_prompt = train_on_prompt
        self.media_token_ids = set(media_token_ids)
        self.start, self.end = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._split = re.compile("(" + "|".join(re.escape(p) for p in expanders) + ")") if expanders else None
        self._kinds = {placeholder: kind for kind, placeholder in PLACEHOLDERS.items()}

    def text(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) if text else []

    def encode(self, sample: Sample) -> Encoded:
        media = {placeholder: iter(sample.media.get(self._kinds[placeholder], [])) for placeholder in self.expanders}
        fields: dict[str, list[Any]] = {}
        ids: list[int] = []
        labels: list[int] = []
        turns = list(sample.turns)
        if turns[0].role != "system" and self.default_system is not None:
            turns.insert(0, type(turns[0])("system", self.default_system))
        newline = self.text("\n")
        for turn in turns:
            head = [self.start, *self.text(f"{turn.role}\n")]
            body: list[int] = []
            for piece in self._split.split(turn.content) if self._split else [turn.content]:
                if piece in self.expanders:
                    expanded = self.expanders[piece](next(media[piece]))
                    body += expanded.ids
                    for name, value in expanded.fields.items():
                        fields.setdefault(name, []).append(value)
                else:
                    body += self.text(piece)
            ids += head + body + [self.end] + newline
            supervised = turn.role == "assistant" or (self.train_on_prompt and turn.role == "user")
            labels += [IGNORE] * len(head) + (body + [self.end] if supervised else [IGNORE] * (len(body) + 1)) + [IGNORE] * len(newline)
        return Encoded(ids, labels, fields)

    def truncate(self, enc: Encoded, limit: int) -> Encoded | str:
        """Cut to ``limit`` tokens; a cut through media, or one leaving nothing to learn, is a reason."""
        if len(enc.input_ids) <= limit:
            return enc
        if any(t in self.media_token_ids for t in enc.input_ids[limit:]):
            return f"{len(enc.input_ids)} tokens, and cutoff_len={limit} would cut through an image, video or audio clip"
        if all(label == IGNORE for label in enc.labels[:limit]):
            return f"{len(enc.input_ids)} tokens, and cutoff_len={limit} would leave no assistant tokens to learn"
        return Encoded(enc.input_ids[:limit], enc.labels[:limit], enc.fields)
