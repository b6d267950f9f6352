"""Reward functions for online RL (``training.grpo.rewards: {name: weight}``).

A reward function is ``fn(completions, references, prompts, **settings) -> list[float]``,
called with keyword arguments: the sampled answers as text, each answer's reference (None where
its prompt has none) and its prompt's last user turn, plus ``settings`` (the ``training.grpo``
section); it accepts ``**kwargs`` so that later mmcore versions may pass more. Built in (this
module, registered by ``mmcore_plugins.rewards``): ``accuracy``, ``exact``, ``format`` and
``length``; a plugin adds its own through the ``mmcore_register_rewards`` hook
(:class:`mmcore.framework.registry.RewardSpec`). Functions that score generated pictures
(``RewardSpec(takes="image")``, the diffusion kit's GRPO) are in :mod:`mmcore.train.image_rewards`.

:class:`RewardSet` resolves the configured names once, before training, and scores a batch of
answers: the weighted sum per answer plus each function's own scores, for the metrics. A
function that raises, returns the wrong count or a non-finite value stops the run with a
one-line error naming it.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

from mmcore.engines.generation import normalize_answer
from mmcore.errors import StageError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_text(completion: str) -> str:
    """What an answer answers: the text inside its last ``<answer>…</answer>`` where it has
    one (an R1-style answer with its reasoning before), else the whole answer."""
    found = _ANSWER.findall(completion)
    return found[-1] if found else completion


def accuracy(completions: Sequence[str], references: Sequence[str | None], prompts: Sequence[str], **_: Any) -> list[float]:
    """1.0 where the answer (inside ``<answer>`` tags, if any) equals the reference after
    normalising case, punctuation, articles and spaces (SQuAD's normalisation), else 0.0."""
    return [float(ref is not None and normalize_answer(answer_text(c)) == normalize_answer(ref)) for c, ref in zip(completions, references)]


def exact(completions: Sequence[str], references: Sequence[str | None], prompts: Sequence[str], **_: Any) -> list[float]:
    """1.0 where the answer equals the reference exactly (outer spaces aside), else 0.0."""
    return [float(ref is not None and c.strip() == ref.strip()) for c, ref in zip(completions, references)]


def format_match(completions: Sequence[str], references: Sequence[str | None], prompts: Sequence[str], *, settings: Any = None, **_: Any) -> list[float]:
    """1.0 where the whole answer matches ``training.grpo.format_pattern`` (default
    ``<think>…</think> <answer>…</answer>``), else 0.0."""
    pattern = re.compile(settings.format_pattern if settings is not None else r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
    return [float(pattern.fullmatch(c.strip()) is not None) for c in completions]


def length(completions: Sequence[str], references: Sequence[str | None], prompts: Sequence[str], **_: Any) -> list[float]:
    """A length penalty: 0.0 for an answer no longer than its reference (in characters),
    falling linearly to -1.0 at twice its length and beyond; 0.0 where there is no reference."""
    out = []
    for c, ref in zip(completions, references):
        if ref is None:
            out.append(0.0)
            continue
        over = len(c.strip()) - len(ref.strip())
        out.append(-min(1.0, max(0, over) / max(1, len(ref.strip()))))
    return out


def similarity(completions: Sequence[str], references: Sequence[str | None], prompts: Sequence[str], **_: Any) -> list[float]:
    """Partial credit: 1 - the Levenshtein distance between the normalised answer (inside
    ``<answer>`` tags, if any) and the normalised reference, over the longer one's length
    (1.0 equal, 0.0 nothing in common); 0.0 where there is no reference. Beside ``accuracy``
    it rewards an answer on its way to the right one ("yel" for "yellow"), which a young
    policy may need to find it at all."""
    out = []
    for c, ref in zip(completions, references):
        if ref is None:
            out.append(0.0)
            continue
        a, b = normalize_answer(answer_text(c)), normalize_answer(ref)
        out.append(1.0 - edit_distance(a, b) / max(len(a), len(b), 1))
    return out


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions and substitutions from ``a`` to ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


class RewardSet:
    """The configured reward functions, by name with their weights, loaded from ``registry``;
    ``takes``: what the run's samples are (``text`` answers, or ``image`` pictures and videos):
    a function of the other kind is refused by name before training."""

    def __init__(self, registry: Any, weights: Mapping[str, float], settings: Any = None, takes: str = "text") -> None:
        specs = {name: registry.reward(name) for name in weights}  # an unknown name fails here, before training
        for name, spec in specs.items():
            if spec.takes != takes:
                fitting = ", ".join(sorted(n for n, s in registry.rewards.items() if s.takes == takes)) or "none installed"
                raise StageError(f"training.grpo.rewards: reward {name!r} scores {spec.takes}s, and this run's samples are {takes}s (rewards on {takes}s: {fitting})")
        self.weights = dict(weights)
        self.settings = settings
        self.takes = takes
        self.functions = {}
        for name, spec in specs.items():
            try:
                self.functions[name] = spec.load()
            except Exception as exc:  # noqa: BLE001  (any import problem of a plugin's function is its one-line error)
                raise StageError(f"training.grpo.rewards: reward {name!r} ({spec.impl}, from {spec.provider or 'unknown'}) cannot be imported: {type(exc).__name__}: {exc}") from exc

    def score(self, completions: Sequence[str], references: Sequence[str | None], prompts: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted total per answer, each function's scores per answer)."""
        return self._score(len(completions), "answer", completions=list(completions), references=list(references), prompts=list(prompts))

    def score_images(self, images: Sequence[Any], prompts: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted total per sample, each function's scores per sample) of generated samples:
        ``images[i]`` float [F, H, W, 3] in [0, 1], ``prompts[i]`` its caption."""
        return self._score(len(images), "sample", images=list(images), prompts=list(prompts))

    def _score(self, count: int, what: str, **arguments: Any) -> tuple[list[float], dict[str, list[float]]]:
        each: dict[str, list[float]] = {}
        for name, fn in self.functions.items():
            try:
                values = fn(**arguments, settings=self.settings)
            except Exception as exc:  # noqa: BLE001  (a user's verifier failing is a one-line error naming it)
                raise StageError(f"training.grpo.rewards: reward {name!r} raised {type(exc).__name__}: {exc}") from exc
            try:
                values = [float(v) for v in values]
            except (TypeError, ValueError) as exc:
                raise StageError(f"training.grpo.rewards: reward {name!r} returned something other than a list of numbers: {exc}") from exc
            if len(values) != count:
                raise StageError(f"training.grpo.rewards: reward {name!r} returned {len(values)} value(s) for {count} {what}(s)")
            bad = next((v for v in values if not math.isfinite(v)), None)
            if bad is not None:
                raise StageError(f"training.grpo.rewards: reward {name!r} returned {bad} (rewards must be finite)")
            each[name] = values
        totals = [sum(self.weights[name] * each[name][i] for name in each) for i in range(count)]
        return totals, each


__all__ = ["RewardSet", "accuracy", "answer_text", "edit_distance", "exact", "format_match", "length", "similarity"]
