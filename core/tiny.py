"""Helpers for the packs' ``init:<preset>`` checkpoints: tiny random-weight models built offline.

A tiny model needs a tiny tokenizer that is still the family's real tokenizer class; the
byte-level BPE vocabularies of Qwen and Whisper come from here, trained on a pack's corpus.
"""

from __future__ import annotations

import json
from typing import Any


def train_byte_level_bpe(corpus: list[str], vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of a byte-level BPE trained on ``corpus``; deterministic for a corpus.

    Merges come back as tuples, which is what ``Qwen2Tokenizer``/``WhisperTokenizer`` take.
    """
    try:
        from tokenizers import ByteLevelBPETokenizer
    except ImportError:
        from mmcore.errors import missing_dependency

        raise missing_dependency("tokenizers", "building a tiny tokenizer for init: presets") from None

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus * 4, vocab_size=vocab_size, min_frequency=1, show_progress=False)
    model = json.loads(bpe._tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges  # type: ignore[return-value]


def byte_level_tokenizer(corpus: list[str], special_tokens: list[str], *, vocab_size: int = 512, eos: str = "</s>",
                         pad: str = "<pad>", bos: str | None = None, chat_template: str | None = None):  # type: ignore[no-untyped-def]
    """A ``tokenizers``-backed transformers tokenizer over a byte-level BPE of ``corpus``.

    For families whose tokenizer class needs files a tiny model cannot have (a SentencePiece
    model, say): ``AutoTokenizer`` reloads it from ``tokenizer.json`` alone. ``special_tokens``
    (media markers, turn markers) are added as special tokens, and ``eos``/``pad``/``bos`` too.
    """
    try:
        from tokenizers import ByteLevelBPETokenizer
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        from mmcore.errors import missing_dependency

        raise missing_dependency("transformers", "building a tiny tokenizer for init: presets") from None

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus * 4, vocab_size=vocab_size, min_frequency=1, show_progress=False)
    named = {"eos_token": eos, "pad_token": pad, **({"bos_token": bos} if bos else {})}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, unk_token=None, **named)
    tokenizer.add_tokens(list(dict.fromkeys([*named.values(), *special_tokens])), special_tokens=True)
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


def pick_preset(presets: dict[str, Any], preset: str) -> Any:
    """``presets[preset]``, or the one-line error an unknown ``init:<preset>`` deserves."""
    from mmcore.errors import StageError

    try:
        return presets[preset]
    except KeyError:
        raise StageError(f"init:{preset}: unknown tiny preset; choose one of {', '.join(presets)}") from None
