"""Conversations -> token ids and labels through the tokenizer's own chat template.

Any family's format (ChatML, LLaVA-1.5's ``USER: ... ASSISTANT:``, InternVL, GLM) is the
template's business: the encoder renders the conversation with it, finds where each media item
landed, and lets the pack expand it. Which characters are learnt comes from the template too:

* **``{% generation %}`` blocks** (transformers' assistant-mask markers), where the template has
  them: exactly the characters inside the blocks are supervised, as
  ``apply_chat_template(..., return_assistant_tokens_mask=True)`` would mark them.
* **Otherwise, prefix differences**: an assistant turn's characters are what rendering the
  conversation up to and including the turn adds to rendering it up to the turn with
  ``add_generation_prompt=True`` (the answer and the template's end-of-turn marker, surrounding
  whitespace trimmed). This needs a template that renders a conversation's prefix as a prefix of
  the whole; one that does not (say, one that drops earlier turns' reasoning) is refused with
  a :class:`ChatTemplateError` that asks for ``{% generation %}`` blocks.

``train_on_prompt`` also supervises user turns (their whole rendering, found by prefix
differences). A token is supervised when its characters overlap a supervised span; the first
token of a sample never is, so no loss crosses samples in a packed row.

Media: a sample's turn text holds placeholders (``<image>``, ``<video>``, ``<audio>``). With
``content="parts"`` (the transformers processor convention, the default) each turn is given to
the template as a list of ``{"type": "text"|"image"|"video"|"audio"}`` parts and the template
writes its own marker per item (``<image>`` for LLaVA,
``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen2-VL); with ``content="text"`` the turn
is one string and the placeholder itself is the marker. The pack names each marker and gives an
*expander* per placeholder, which reads one media file and returns its tokens and arrays
(:class:`Piece`); the encoder gathers the arrays per field name in order of appearance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from mmcore.data.mllm import PLACEHOLDERS, Sample

IGNORE = -100

#: placeholder -> the part type a processor-style template expects
PART_TYPES = {"<image>": "image", "<video>": "video", "<audio>": "audio"}


class ChatTemplateError(ValueError):
    """The chat template cannot encode this conversation (one line, names what is wrong)."""


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
        ``input_features``) concatenated, grids and lengths (``*_grid_thw``, ``*_lengths``,
        ``image_sizes``) as long rows, anything else as float values."""
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
            elif name.endswith(("_grid_thw", "_lengths", "_sizes")):
                out[name] = torch.tensor([v for item in items for v in item], dtype=torch.long)
            else:
                out[name] = torch.tensor([v for item in items for v in item], dtype=torch.float32)
        return out


GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatTemplateEncoder:
    """Encodes :class:`~mmcore.data.mllm.Sample` turns with a chat template.

    Args:
        tokenizer: the model's tokenizer (a ``tokenizers``-backed one: offsets map characters to tokens).
        expanders: placeholder (``"<image>"``) -> function from a media file to a :class:`Piece`.
        markers: placeholder -> what the template writes for one item of it (default: the
            placeholder itself).
        chat_template: the Jinja template (default: the tokenizer's own).
        content: ``"parts"`` (turns as typed part lists) or ``"text"`` (turns as strings).
        default_system: a system turn for samples that bring none (None: leave it to the template).
        train_on_prompt: also supervise user turns.
        media_token_ids: tokens that belong to media; truncation may not cut through them.
    """

    def __init__(
        self,
        tokenizer: Any,
        expanders: dict[str, Expander],
        *,
        markers: dict[str, str] | None = None,
        chat_template: str | None = None,
        content: Literal["parts", "text"] = "parts",
        default_system: str | None = None,
        train_on_prompt: bool = False,
        media_token_ids: Iterable[int] = (),
    ) -> None:
        self.tok = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ChatTemplateError("the tokenizer has no chat_template; save one with it or give chat_template=")
        self.expanders = expanders
        self.markers = {p: (markers or {}).get(p, p) for p in expanders}
        self.content = content
        self.default_system = default_system
        self.train_on_prompt = train_on_prompt
        self.media_token_ids = set(media_token_ids)
        self.native_mask = bool(GENERATION_BLOCK.search(self.template))
        self._placeholders = re.compile("(" + "|".join(re.escape(p) for p in expanders) + ")") if expanders else None
        by_marker = sorted(self.markers.items(), key=lambda item: -len(item[1]))  # longest first: no marker shadows another
        self._marker_of = {marker: placeholder for placeholder, marker in by_marker}
        self._markers = re.compile("(" + "|".join(re.escape(m) for _, m in by_marker) + ")") if expanders else None
        self._kinds = {placeholder: kind for kind, placeholder in PLACEHOLDERS.items()}

    # -- rendering ---------------------------------------------------------------------------

    def messages(self, sample: Sample) -> list[dict[str, Any]]:
        """The sample's turns as chat-template messages."""
        turns = list(sample.turns)
        if turns and turns[0].role != "system" and self.default_system is not None:
            turns.insert(0, type(turns[0])("system", self.default_system))
        return [{"role": t.role, "content": self._content(t.content)} for t in turns]

    def _content(self, text: str) -> Any:
        if self.content == "text" or self._placeholders is None:
            return text if self.content == "text" else [{"type": "text", "text": text}]
        parts = []
        for piece in self._placeholders.split(text):
            if piece in self.expanders:
                parts.append({"type": PART_TYPES.get(piece, piece.strip("<>"))})
            elif piece:
                parts.append({"type": "text", "text": piece})
        return parts

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt)

    def supervised_spans(self, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """(the rendered conversation, the character spans whose tokens are learnt)."""
        if self.native_mask:
            from transformers.utils.chat_template_utils import render_jinja_template

            rendered, indices = render_jinja_template(
                conversations=[messages],
                chat_template=self.template,
                return_assistant_tokens_mask=True,
                **self.tok.special_tokens_map,
            )
            text, spans = rendered[0], [tuple(s) for s in indices[0]]
            roles = ("user",) if self.train_on_prompt else ()
        else:
            text, spans = self.render(messages), []
            roles = ("user", "assistant") if self.train_on_prompt else ("assistant",)
        for i, message in enumerate(messages):
            if message["role"] in roles:
                spans.append(self._turn_span(messages, i, text))
        return text, sorted(spans)

    def _turn_span(self, messages: list[dict[str, Any]], i: int, whole: str) -> tuple[int, int]:
        before = self.render(messages[:i], add_generation_prompt=messages[i]["role"] == "assistant") if i else ""
        upto = self.render(messages[: i + 1])
        if not (upto.startswith(before) and whole.startswith(upto)):
            raise ChatTemplateError(
                f"the chat template does not render turn {i + 1} ({messages[i]['role']}) as a continuation of the turns before it, "
                "so its tokens cannot be told apart; give the template {% generation %} blocks around what the assistant says"
            )
        start, end = len(before), len(upto)
        while start < end and upto[start].isspace():
            start += 1
        while end > start and upto[end - 1].isspace():
            end -= 1
        return start, end

    # -- encoding ----------------------------------------------------------------------------

    def encode(self, sample: Sample) -> Encoded:
        """A training sample's ids and labels; media of a kind the model takes no expander for is
        a :class:`~mmcore.data.media.MediaError` naming its file (preprocess counts the sample as
        bad), rather than a sample trained on as if the file were not there."""
        unusable = self._unusable(sample)
        if unusable:
            from mmcore.data.media import MediaError

            kind, files = unusable[0]
            raise MediaError(f"{files[0]}: this model takes no {kind} ({self._takes()})")
        messages = self.messages(sample)
        text, spans = self.supervised_spans(messages)
        return self._encode_rendered(text, spans, sample)

    def encode_prompt(self, sample: Sample) -> Encoded:
        """The sample's turns (ending with the user's) and the assistant's generation prompt:
        what a model answers from, as training formatted it. Nothing is supervised."""
        unusable = self._unusable(sample)
        if unusable:  # a model answering as if the file were not there would mislead
            raise ChatTemplateError(f"this model takes no {unusable[0][0]} ({self._takes()})")
        return self._encode_rendered(self.render(self.messages(sample), add_generation_prompt=True), [], sample)

    def _unusable(self, sample: Sample) -> list[tuple[str, list[Any]]]:
        """The sample's media kinds (with their files) that no expander of this model takes."""
        return [(kind, list(files)) for kind, files in sample.media.items() if files and self._placeholder_of(kind) not in self.expanders]

    def _takes(self) -> str:
        takes = [kind for kind in PLACEHOLDERS if PLACEHOLDERS[kind] in self.expanders]
        return f"it takes {', '.join(takes) or 'text only'}"

    def _placeholder_of(self, kind: str) -> str:
        return PLACEHOLDERS.get(kind, f"<{kind.rstrip('s')}>")

    def _encode_rendered(self, text: str, spans: list[tuple[int, int]], sample: Sample) -> Encoded:
        media = {p: list(sample.media.get(self._kinds.get(p, p.strip("<>") + "s"), [])) for p in self.expanders}
        pieces = self._markers.split(text) if self._markers else [text]
        found = {p: sum(1 for piece in pieces if self._marker_of.get(piece) == p) for p in self.expanders}
        for placeholder, items in media.items():
            if found[placeholder] != len(items):
                raise ChatTemplateError(
                    f"the chat template wrote {found[placeholder]} {self.markers[placeholder]!r} for the sample's {len(items)} "
                    f"{placeholder} item(s): check the pack's marker for {placeholder} and that each item has its placeholder"
                )
        ids: list[int] = []
        labels: list[int] = []
        fields: dict[str, list[Any]] = {}
        at = 0
        remaining = {p: iter(items) for p, items in media.items()}
        for piece in pieces:
            placeholder = self._marker_of.get(piece)
            if placeholder is not None:
                expanded = self.expanders[placeholder](next(remaining[placeholder]))
                ids += expanded.ids
                labels += [IGNORE] * len(expanded.ids)
                for name, value in expanded.fields.items():
                    fields.setdefault(name, []).append(value)
            elif piece:
                tokens = self.tok(piece, add_special_tokens=False, return_offsets_mapping=True)
                for token, (s, e) in zip(tokens["input_ids"], tokens["offset_mapping"]):
                    ids.append(token)
                    labels.append(token if _overlaps(spans, at + s, at + e) else IGNORE)
            at += len(piece)
        if labels:
            labels[0] = IGNORE
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


def _overlaps(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    # an empty-width token (offsets (s, s)) is inside a span when s is
    return any(s < max(end, start + 1) and start < e for s, e in spans)


__all__ = ["IGNORE", "PART_TYPES", "ChatTemplateEncoder", "ChatTemplateError", "Encoded", "Expander", "Piece"]
