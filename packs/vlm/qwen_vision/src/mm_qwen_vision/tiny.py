"""Tiny Qwen tokenizers for random-weight checkpoints built at test time (Qwen2-VL, Qwen3-VL,
Qwen3-Omni).

A Qwen2 tokenizer over a small byte-level BPE trained on ``CORPUS`` (the shape demo's words and
common chat text), with the Qwen special tokens. The BPE is trained deterministically, so the
same call gives the same vocabulary on every run and machine.
"""

from __future__ import annotations

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Words the tiny tokenizer learns whole: the demo's vocabulary plus common chat text.
CORPUS = [
    "You are a helpful assistant.",
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "What shape is it? What shape is this? Which shape is shown? Describe the image.",
    "red green blue yellow triangle square circle",
    "The shape is red. The shape is green. The shape is blue. The shape is yellow.",
    "It is a triangle. It is a square. It is a circle.",
    "user assistant system image video picture photo",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]


def build_tokenizer(vocab_size: int = 384, corpus: tuple[str, ...] = (), special_tokens: tuple[str, ...] = (), named: dict[str, str] | None = None, tokenizer_class: str = "Qwen2Tokenizer"):  # type: ignore[no-untyped-def]
    """A Qwen2 tokenizer over a small byte-level BPE, with the Qwen special tokens.

    Args:
        corpus: more text to learn words from (a family's demo questions).
        special_tokens: more special tokens (the omni thinkers' audio tokens).
        named: tokenizer attributes naming special tokens (``{"audio_token": "<|audio_pad|>"}``),
            which the omni processors read.
        tokenizer_class: the transformers tokenizer class over the BPE (``Qwen3_5Tokenizer``
            for Qwen3.5, whose pre-tokenizer differs).
    """
    import transformers

    from mmcore.engines import train_byte_level_bpe

    vocab, merges = train_byte_level_bpe([*CORPUS, *corpus], vocab_size)
    tokenizer = getattr(transformers, tokenizer_class)(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", **(named or {}))
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS[1:], *special_tokens]})
    tokenizer.add_tokens(["<|endoftext|>"], special_tokens=True)
    return tokenizer
