"""What ``mmcore infer`` and the evaluate stage share: requests, which weights, batched decoding,
the answer metrics, and the files results go to.

A :class:`Request` is one prompt with its media, from command-line flags or one line of a
JSONL file in the training data's MLLM fields (``messages`` or ``prompt``, ``images``,
``videos``, ``audios``). Requests are checked before any model loads: a missing or unreadable
media file, or a prompt with more ``<image>`` than images, is that request's one-line error,
and the rest still run.

:func:`generate_tokens` decodes many prompts of a transformers causal LM together: sorted by
length so that a batch wastes little padding, left-padded so that every row's next token is
at the same column, with the KV cache. Greedy unless ``generation.temperature`` > 0.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from mmcore.engines.report import write_results  # noqa: F401  (its SDK 1.x place)
from mmcore.errors import UsageError

#: media kind -> the placeholder a prompt writes for one item of it (the training data's)
PLACEHOLDERS = {"images": "<image>", "videos": "<video>", "audios": "<audio>"}


@dataclass
class Request:
    """One thing to answer, transcribe or generate.

    Attributes:
        turns: ``(role, text)`` of the conversation so far, ending with the user's turn
            (one turn for a plain prompt; ``[]`` for a transcription without a prompt).
        media: ``"images"``/``"videos"``/``"audios"`` -> files, in placeholder order.
        where: where it came from (``"--prompt"``, ``"requests.jsonl:3"``), for messages.
        reference: the expected answer, where the request brought one (an assistant turn
            after the last user turn): kept in the results beside what was generated.
        error: why it cannot run (then nothing else is used).
    """

    turns: list[tuple[str, str]] = field(default_factory=list)
    media: dict[str, list[Path]] = field(default_factory=dict)
    where: str = ""
    reference: str | None = None
    error: str | None = None

    @property
    def prompt(self) -> str:
        """The user's last turn."""
        return next((text for role, text in reversed(self.turns) if role == "user"), "")


@dataclass(frozen=True)
class ModelSource:
    """The weights ``mmcore infer`` uses.

    Attributes:
        kind: ``"train"`` (a training checkpoint: DCP, built as training built it),
            ``"export"`` (the export stage's folder) or ``"folder"`` (any folder in the
            ecosystem's layout: a Hugging Face model, a diffusers pipeline).
        path: the checkpoint or folder.
    """

    kind: str
    path: Path


def media_problem(turns: Sequence[tuple[str, str]], media: Mapping[str, Sequence[Path]]) -> str | None:
    """What is wrong with a request's media, or None: each file must be a readable file, and a
    prompt that writes placeholders must write exactly one per item."""
    for kind, files in media.items():
        for path in files:
            if not path.is_file():
                return f"{kind[:-1]} file not found: {path}"
            try:
                with open(path, "rb") as handle:
                    handle.read(1)
            except OSError as exc:
                return f"{kind[:-1]} file {path} cannot be read: {exc.strerror or exc}"
    text = "".join(content for _, content in turns)
    for kind, placeholder in PLACEHOLDERS.items():
        count, have = text.count(placeholder), len(media.get(kind, ()))
        if count and count != have:
            return f"the prompt has {count} {placeholder} but {have} {kind[:-1]}(s) were given"
    return None


def request_from_flags(prompt: str | None, images: Sequence[str], videos: Sequence[str], audios: Sequence[str]) -> Request:
    media = {kind: [Path(f).expanduser().resolve() for f in files] for kind, files in (("images", images), ("videos", videos), ("audios", audios)) if files}
    turns = [("user", prompt)] if prompt is not None else []
    return Request(turns=turns, media=media, where="command line", error=media_problem(turns, media))


def read_requests(path: Path, *, any_media_path: bool = False) -> list[Request]:
    """The requests of a JSONL file, one per non-empty line; a bad line is a request with an error.

    A line is ``{"prompt": "...", "images": [...]}`` or a conversation in the training data's
    fields (``messages`` with ``role``/``content``, or ShareGPT's ``conversations`` with
    ``from``/``value``), whose last user turn is answered. Media paths are relative to the
    file's folder and, as in datasets, may not leave it (absolute, ``..``, a link out): a
    request file from elsewhere must not make ``mmcore infer`` read any file on the machine.
    ``any_media_path`` (``--allow-any-media-path``) lifts that for a file the user trusts.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--input {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    requests = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            requests.append(_request_of(line, path, number, any_media_path))
    if not requests:
        raise UsageError(f"--input {path}: no requests (one JSON object per line)")
    return requests


_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system"}


def _request_of(line: str, path: Path, number: int, any_media_path: bool = False) -> Request:
    where = f"{path.name}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return Request(where=where, error=f"invalid JSON: {exc.msg} (column {exc.colno})")
    if not isinstance(record, dict):
        return Request(where=where, error=f"expected a JSON object, got {type(record).__name__}")
    turns: list[tuple[str, str]] = []
    messages: Any = None
    if isinstance(record.get("prompt"), str):
        turns = [("user", record["prompt"])]
    else:
        messages = record.get("messages", record.get("conversations"))
        if messages is None and any(record.get(kind) for kind in PLACEHOLDERS):
            messages = []  # media alone: a transcription, a caption to write
        elif not isinstance(messages, list) or not messages:
            return Request(where=where, error="no 'prompt' string, no 'messages' list and no media")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                return Request(where=where, error=f"message {i} is not an object")
            role = _ROLES.get(str(message.get("role", message.get("from"))))
            content = message.get("content", message.get("value"))
            if role is None or not isinstance(content, str):
                return Request(where=where, error=f"message {i} needs a role (user/assistant/system) and text content")
            turns.append((role, content))
    reference = None
    if turns and turns[-1][0] == "assistant":
        reference = turns.pop()[1]
    if (turns or messages != []) and (not turns or turns[-1][0] != "user"):
        return Request(where=where, error="no user turn to answer")
    media: dict[str, list[Path]] = {}
    for kind in PLACEHOLDERS:
        files = record.get(kind) or []
        files = [files] if isinstance(files, str) else files
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            return Request(where=where, error=f"field {kind!r} must be a list of paths")
        if files:
            nul = next((f for f in files if "\0" in f), None)
            if nul is not None:
                return Request(where=where, error=f"{kind[:-1]} path {nul!r} contains a NUL byte")
            media[kind] = [(path.parent / f).resolve() for f in files]
            root = path.parent.resolve()
            for name, file in zip(files, media[kind]):
                if not any_media_path and not file.is_relative_to(root):
                    return Request(
                        where=where, error=f"{kind[:-1]} path {name!r} leads out of the request file's folder {root} (paths are relative to it; --allow-any-media-path trusts the file's paths)"
                    )
    return Request(turns=turns, media=media, where=where, reference=reference, error=media_problem(turns, media))


def context_length(config: Any) -> int | None:
    """The most positions the model's language part was built for (``max_position_embeddings``
    of its text config), or None where the config does not say."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for part in (text, config):
        value = getattr(part, "max_position_embeddings", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def batches(items: Sequence[Any], size: int, length: Callable[[Any], int]) -> Iterator[list[int]]:
    """Indices of ``items`` in batches of ``size``, longest first, so that a batch holds
    similar lengths (less padding) and the first batch finds a memory problem at once."""
    order = sorted(range(len(items)), key=lambda i: -length(items[i]))
    for start in range(0, len(order), size):
        yield order[start : start + size]


# ------------------------------------------------------------------ causal LM decoding


def left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    """(input ids, attention mask) of token rows, padded on the left."""
    import torch

    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, longest - len(row) :] = torch.as_tensor(row)
            mask[i, longest - len(row) :] = 1
    return ids, mask


def generation_dtype(ctx: Any) -> Any:
    """The torch dtype ``generation.dtype`` means on this run's device (``auto``: bfloat16 on an
    accelerator that supports it, float32 on CPU)."""
    import torch

    chosen = ctx.config.generation.dtype
    if chosen == "auto":
        accelerator = ctx.accelerator
        return torch.bfloat16 if accelerator.device_type != "cpu" and accelerator.supports_bf16() else torch.float32
    return getattr(torch, chosen)


def sampling_options(generation: Any, seed: int) -> dict[str, Any]:
    """``generate()`` keyword arguments of a ``generation`` config section (greedy at temperature 0)."""
    import torch

    if generation.temperature <= 0:
        return {"do_sample": False}
    torch.manual_seed(generation.seed if generation.seed is not None else seed)
    return {"do_sample": True, "temperature": generation.temperature, "top_p": generation.top_p}


def generate_tokens(
    model: Any,
    prompts: Sequence[Any],
    inputs_of: Callable[[list[Any]], dict[str, Any]],
    *,
    length: Callable[[Any], int],
    end_ids: Sequence[int],
    pad_id: int,
    max_new_tokens: int | Callable[[Any], int],
    batch_size: int,
    options: Mapping[str, Any] | None = None,
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
) -> list[list[int]]:
    """The tokens a transformers causal LM generates after each prompt, end token excluded.

    Args:
        model: has ``generate()``; its inputs come from ``inputs_of``.
        prompts: whatever ``inputs_of`` turns into model inputs.
        inputs_of: prompts of one batch -> ``generate()`` inputs, ``input_ids`` left-padded
            (:func:`left_padded`) with their ``attention_mask``, media concatenated in order.
        length: a prompt's token count (batches group similar lengths).
        end_ids: tokens that end an answer.
        pad_id: the padding token (what ``generate()`` writes after a row has ended).
        max_new_tokens: a bound for all, or ``prompt -> bound`` (a batch takes its largest).
        batch_size: prompts per ``generate()`` call.
        options: more ``generate()`` arguments (:func:`sampling_options`).
        progress: ``(batches, total) -> batches`` to show progress.
    """
    import torch

    out: list[list[int]] = [[] for _ in prompts]
    groups = list(batches(prompts, batch_size, length))
    for group in progress(groups, len(groups)) if progress else groups:
        chosen = [prompts[i] for i in group]
        inputs = inputs_of(chosen)
        bound = max(max_new_tokens(p) for p in chosen) if callable(max_new_tokens) else max_new_tokens
        with torch.no_grad():
            generated = model.generate(**inputs, max_new_tokens=bound, eos_token_id=list(end_ids), pad_token_id=pad_id, **{"do_sample": False, **(options or {})})
        start = inputs["input_ids"].shape[1]
        for row, i in enumerate(group):
            tokens = generated[row, start:].tolist()
            ends = [k for k, t in enumerate(tokens) if t in end_ids]
            out[i] = tokens[: ends[0]] if ends else tokens
    return out


# ------------------------------------------------------------------ answer metrics

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = re.compile(r"[^\w\s]")


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", _PUNCTUATION.sub(" ", text.lower())).split())


def exact_match(prediction: str, reference: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(reference)


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's token F1 of the normalised words."""
    ours, theirs = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not ours or not theirs:
        return float(ours == theirs)
    common = sum((Counter(ours) & Counter(theirs)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(ours), common / len(theirs)
    return 2 * precision * recall / (precision + recall)


def answer_scores(prediction: str, reference: str) -> dict[str, float]:
    return {"exact_match": float(exact_match(prediction, reference)), "token_f1": token_f1(prediction, reference)}


# ------------------------------------------------------------------ where results go


def read_held_out(ctx: Any, read: Callable[[Path], Iterable[Any]], encode: Callable[[Any], Any], errors: tuple[type[BaseException], ...]) -> tuple[list[tuple[str, Any]], int]:
    """The items of ``evaluate.datasets``, at most ``evaluate.limit``: ``(file:index, encode(item))``,
    and how many were bad samples (skipped, counted and listed in ``bad_samples.jsonl`` when
    ``data.on_bad_sample`` is ``skip``; otherwise the first stops the stage in one line).

    Args:
        ctx: the evaluate stage's context; each file is recorded as its input.
        read: a dataset file -> its items (with ``file`` and ``index``) or ``BadSample`` records, as
            the pack's preprocess reads them.
        encode: an item -> what the evaluation needs (token ids, features, ...).
        errors: what ``encode`` raises for a bad item (unreadable media, a bad record).
    """
    from mmcore.data.badsamples import BadSample, BadSamples

    cfg = ctx.config.evaluate
    bad = BadSamples(ctx.config.data.on_bad_sample, ctx.stage_dir / "bad_samples.jsonl")
    items: list[tuple[str, Any]] = []
    for path in map(Path, cfg.datasets):
        ctx.record_input(path)
        for item in read(path):
            if len(items) >= cfg.limit:
                break
            if isinstance(item, BadSample):
                bad.report(item)
                continue
            try:
                items.append((f"{path.name}:{item.index}", encode(item)))
            except errors as exc:
                bad.report(BadSample(item.file, item.index, str(exc)))
    bad.close()
    return items, len(bad.found)


def empty_evaluation(ctx: Any, skipped: int = 0) -> Any:
    """The evaluate stage's result when there is nothing held out: empty results, and why."""
    from mmcore.framework.pack import StageResult

    write_results(ctx.stage_dir, [], {"items": 0, "skipped": skipped}, title=f"{ctx.pack}: evaluation", columns=(), ctx=ctx)
    return StageResult(
        outputs={"results": "results.jsonl", "metrics": "metrics.json"},
        metrics={"items": 0, "skipped": skipped},
        notes=["nothing to evaluate: no held-out items (set data.eval_fraction, or evaluate.datasets / `mmcore eval --data FILE`)"],
    )


__all__ = [
    "ModelSource",
    "Request",
    "PLACEHOLDERS",
    "answer_scores",
    "empty_evaluation",
    "read_held_out",
    "batches",
    "exact_match",
    "generate_tokens",
    "generation_dtype",
    "left_padded",
    "media_problem",
    "normalize_answer",
    "read_requests",
    "request_from_flags",
    "sampling_options",
    "token_f1",
    "write_results",
]
