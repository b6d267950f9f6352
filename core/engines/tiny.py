"""Helpers for the packs' ``init:<preset>`` checkpoints: tiny random-weight models built offline.

A tiny model needs a tiny tokenizer that is still the family's real tokenizer class; the
byte-level BPE vocabularies of Qwen and Whisper, the T5-style unigram of UMT5/T5 and CLIP's
BPE come from here, built from a pack's corpus (deterministically: two builds of one preset
tokenise alike, so two run directories train alike).
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


def byte_level_tokenizer(corpus: list[str], special_tokens: list[str], *, vocab_size: int = 512, eos: str = "</s>", pad: str = "<pad>", bos: str | None = None, chat_template: str | None = None):  # type: ignore[no-untyped-def]
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


def unigram_tokenizer(corpus: list[str]):  # type: ignore[no-untyped-def]
    """A ``T5TokenizerFast`` over a unigram vocabulary of the corpus's words and characters.

    The vocabulary is built here, not trained: tokenizers' unigram trainer gives scores that
    differ in the last bits from run to run, which changes tokenisation at ties.
    """
    import math
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import T5TokenizerFast

    words = Counter(w for line in corpus for w in line.replace(",", " ,").split())
    chars = Counter(c for line in corpus for c in line if not c.isspace())
    total = sum(words.values()) + sum(chars.values())
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", math.log(1 / total))]
    pieces += [(f"\u2581{w}", math.log(n / total)) for w, n in sorted(words.items())]
    pieces += [(c, math.log(n / total) - 5.0) for c, n in sorted(chars.items())]  # fall back to characters
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("  ", " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    return T5TokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", extra_ids=0)


def clip_tokenizer(corpus: list[str], max_length: int = 77):  # type: ignore[no-untyped-def]
    """A ``CLIPTokenizer`` whose vocabulary is every byte (alone and word-final, ``</w>``) and
    every lower-cased word of the corpus whole, with the merges that build those words left to
    right: CLIP's real tokenizer class and pipeline, built (not trained: the BPE trainer breaks
    ties differently from run to run). ``max_length``: the text encoder's positions (what
    pipelines pad to)."""
    import re

    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for token in [*alphabet, *(c + "</w>" for c in alphabet)]:
        vocab.setdefault(token, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in sorted({w for line in corpus for w in re.findall(r"[a-z]+", line.lower())}):
        pieces = [*word[:-1], word[-1] + "</w>"]
        left = pieces[0]
        for right in pieces[1:]:
            if (left, right) not in merges:
                merges.append((left, right))
            left += right
            vocab.setdefault(left, len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)
