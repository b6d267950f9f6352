"""Preference pairs as the VLM kit stores them (preprocessed with ``data.ranking``): one sample
holds a prompt's chosen and rejected answers (``chosen_input_ids``, ``rejected_labels``, ...)
beside the media both share. The views here make rows of them: both answers for DPO
(:mod:`.dpo`), the chosen one where a stage reads a pair as an SFT sample (export's probe,
evaluate's references, the towers' work).
"""

from __future__ import annotations

from typing import Any

PAIR_FIELDS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")


class PairSamples:
    """A split of a preference dataset whose items carry their index (for the reference table)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.data[i], "pair_index": i}

    def length(self, i: int) -> int:
        return self.data.length(i)

    def meta(self, i: int) -> dict[str, Any]:
        return self.data.meta(i)


def answer_views(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chosen row of every pair, then the rejected rows, each with the pair's media."""

    def media(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k not in PAIR_FIELDS and k != "pair_index"}

    return [{"input_ids": s["chosen_input_ids"], "labels": s["chosen_labels"], **media(s)} for s in samples] + [
        {"input_ids": s["rejected_input_ids"], "labels": s["rejected_labels"], **media(s)} for s in samples
    ]


def chosen_view(sample: dict[str, Any]) -> dict[str, Any]:
    """A pair as the SFT sample of its chosen answer (what evaluate answers and scores against)."""
    return answer_views([sample])[0] if "chosen_input_ids" in sample else sample


__all__ = ["PAIR_FIELDS", "PairSamples", "answer_views", "chosen_view"]
