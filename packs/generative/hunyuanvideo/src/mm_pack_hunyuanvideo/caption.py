"""One tensor per caption for features that are several: the kit caches, stacks and drops one
tensor per caption, and HunyuanVideo reads a caption as sequences of states with token masks
(and 1.0 a pooled vector too). They travel as rows of one [R, D] tensor: each sequence's rows
(zero-padded to the widest, D), then the vectors laid end to end in as many more rows as they
fill. ``Layout`` says where each part is."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Layout:
    """``sequences``: (tokens, width) of each sequence, in order; ``vectors``: each vector's length."""

    sequences: Sequence[tuple[int, int]]
    vectors: Sequence[int]

    @property
    def width(self) -> int:
        return max(width for _, width in self.sequences)

    @property
    def rows(self) -> int:
        return sum(tokens for tokens, _ in self.sequences) + math.ceil(sum(self.vectors) / self.width)

    def join(self, sequences: Sequence[Any], vectors: Sequence[Any]) -> Any:
        """[tokens_i, width_i] sequences and 1-D vectors -> [rows, width]."""
        import torch

        dtype = sequences[0].dtype
        parts = [torch.nn.functional.pad(s.to(dtype), (0, self.width - s.shape[-1])) for s in sequences]
        flat = torch.cat([v.to(dtype).flatten() for v in vectors])
        flat = torch.nn.functional.pad(flat, (0, self.rows * self.width - sum(len(p) for p in parts) * self.width - flat.numel()))
        return torch.cat([*parts, flat.view(-1, self.width)])

    def split(self, text: Any) -> tuple[list[Any], list[Any]]:
        """[B, rows, width] -> ([B, tokens_i, width_i] sequences, [B, length_j] vectors)."""
        sequences, start = [], 0
        for tokens, width in self.sequences:
            sequences.append(text[:, start : start + tokens, :width])
            start += tokens
        flat = text[:, start:].flatten(1)
        vectors, at = [], 0
        for length in self.vectors:
            vectors.append(flat[:, at : at + length])
            at += length
        return sequences, vectors


def caption_start(tokenize: Any) -> int:
    """Where the caption's tokens begin in a templated prompt: the first position at which two
    captions' token ids differ (``tokenize(caption) -> ids``)."""
    a, b = tokenize("red"), tokenize("blue")
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
