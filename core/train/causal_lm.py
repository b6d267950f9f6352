"""Batching, loss and held-out accuracy for decoder LMs fed token rows (+ media), any family.

Samples are dicts with ``input_ids`` and ``labels`` (-100 where nothing is learned). A batch
is either right-padded rows with an ``attention_mask``, or one packed row whose ``segments``
keep the samples' lengths (the pack turns those into restarting position ids, from which
transformers builds an attention mask that isolates the samples). The first token of every
sample is never supervised, so no loss crosses samples in a packed row.
"""

from __future__ import annotations

from typing import Any, Callable

IGNORE = -100


def padded_rows(samples: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    import torch

    lengths = torch.tensor([len(s["input_ids"]) for s in samples])
    longest = int(lengths.max())
    # the rows' tokens in one assignment each (row-major, as the samples come): a row at a time
    # cost ~30 us a row, a demo's batch of 16 half a millisecond
    real = torch.arange(longest)[None] < lengths[:, None]
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE, dtype=torch.long)
    ids[real] = torch.cat([s["input_ids"] for s in samples]).long()
    labels[real] = torch.cat([s["labels"] for s in samples]).long()
    return {"input_ids": ids, "labels": labels, "attention_mask": real.long()}


def packed_rows(samples: list[dict[str, Any]], counts: dict[str, str] | None = None) -> dict[str, Any]:
    """One row; ``segments`` = sample lengths, and for each ``counts`` item (batch key -> sample
    field) how many rows of that field each sample brings (e.g. images per sample)."""
    import torch

    batch = {
        "input_ids": torch.cat([s["input_ids"] for s in samples])[None],
        "labels": torch.cat([s["labels"] for s in samples])[None],
        "segments": torch.tensor([len(s["input_ids"]) for s in samples]),
    }
    for key, field in (counts or {}).items():
        batch[key] = torch.tensor([len(s.get(field, ())) for s in samples])
    return batch


def count_loss_tokens(labels: Any) -> int:
    return int((labels[:, 1:] != IGNORE).sum())


def next_token_loss_sum(logits: Any, labels: Any) -> Any:
    """Summed next-token cross-entropy over supervised tokens (the train engine normalises)."""
    import torch.nn.functional as F

    logits = logits[:, :-1].float()
    targets = labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="sum")


def exact_match(logits: Any, labels: Any) -> Any:
    """Per row: every supervised token is the argmax (what greedy decoding would answer)."""
    targets = labels[:, 1:]
    hit = (logits[:, :-1].argmax(-1) == targets) | (targets == IGNORE)
    return hit.all(dim=1)


def evaluate_accuracy(
    ctx: Any, model: Any, held_out: Any, collate_one: Callable[[dict[str, Any]], dict[str, Any]], logits_of: Callable[[Any, dict[str, Any]], Any], fill: Any = None
) -> dict[str, float]:
    """Exact-match accuracy on the held-out samples, one sample per forward, work split across
    ranks; with ``fill`` (:class:`~mmcore.data.fillers.Fill` over ``held_out``) an item lacking
    media another rank's item of the same round holds is collated with its fillers."""
    from mmcore.engines.evaluation import sharded_sums

    if len(held_out) == 0:
        return {}
    device = next(model.parameters()).device

    def measure(i: int, kinds: Any = ()) -> list[float]:
        collated = fill.collate([held_out[i]], kinds) if kinds else collate_one(held_out[i])
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in collated.items()}
        return [float(exact_match(logits_of(model, batch), batch["labels"]).sum()), 1.0]

    hits, total = sharded_sums(ctx, len(held_out), measure, 2, fill=fill)
    return {"accuracy": hits / total}


def answer_span(sample: dict[str, Any]) -> tuple[int, list[int]]:
    """(where the prompt ends, the first answer's tokens) of a preprocessed sample."""
    supervised = (sample["labels"] != IGNORE).nonzero().flatten()
    start = int(supervised[0])
    return start, sample["input_ids"][start : int(supervised[-1]) + 1].tolist()


def generate_accuracy(model: Any, held_out: Any, prompt_inputs: Callable[[dict[str, Any], int], dict[str, Any]], end_id: int, pad_id: int, limit: int = 64) -> float:
    """Greedy ``generate()`` on each held-out prompt, one at a time; correct when it reproduces the
    first answer. (The evaluate stage decodes in batches: :func:`mmcore.engines.generation.generate_tokens`,
    which this calls with batches of one.)

    ``prompt_inputs(sample, start)`` builds the model inputs of the sample's tokens before
    ``start`` (where its first answer begins), media included.
    """
    from mmcore.engines.generation import generate_tokens

    items = [(held_out[i], *answer_span(held_out[i])) for i in range(min(limit, len(held_out)))]
    tokens = generate_tokens(
        model, items, lambda chosen: prompt_inputs(chosen[0][0], chosen[0][1]), length=lambda item: item[1], end_ids=[end_id], pad_id=pad_id, max_new_tokens=lambda item: len(item[2]) + 2, batch_size=1
    )
    answers = [answer[:-1] if answer and answer[-1] == end_id else answer for _, _, answer in items]
    return sum(t == a for t, a in zip(tokens, answers)) / max(len(items), 1)
