"""Helpers for the packs' ``init:<preset>`` checkpoints: tiny random-weight models built offline.

A tiny model needs a tiny tokenizer that is still the family's real tokenizer class; the
byte-level BPE vocabularies of Qwen and Whisper come from here, trained on a pack's corpus.
"""

from __future__ import annotations

import json


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
