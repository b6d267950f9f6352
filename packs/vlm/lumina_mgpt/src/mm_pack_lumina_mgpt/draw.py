"""The evaluate stage's held-out text -> image items: the export draws each picture greedily in
Lumina's layout (size tokens from the prompt's target, then codes row by row with new-lines),
scored by the share of the target's code tokens it reproduces. transformers' Chameleon has no
VQ decoder (Lumina-mGPT decodes with Meta's original VQGAN checkpoint), so the drawn tokens are
written to ``pictures.jsonl``, not decoded to pixels."""

from __future__ import annotations

import json
from typing import Any


def draw(family: Any, model: Any, prompt: list[int], rows: int, cols: int, codes: list[int], newline: int, end: int) -> list[int]:
    """A picture of ``rows`` x ``cols`` codes after ``prompt`` (which ends with its size tokens),
    greedily, the layout forced as Lumina-mGPT's sampler forces it: a code at each place (the
    best of the image codes), the new-line token closing each row, ``<eoss>`` after the last."""
    import torch

    ids, allowed = list(prompt), torch.tensor(codes)
    with torch.no_grad():
        for _ in range(rows):
            for _ in range(cols):
                batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
                scores = family.forward_logits(model, batch)[0, -1]
                ids.append(int(allowed[scores[allowed].argmax()]))
            ids.append(newline)
    return ids[len(prompt) :] + [end]


def evaluate_pictures(family: Any, ctx: Any, upstream: Any, text_result: Any) -> Any:
    from mmcore import StageResult
    from mmcore.kits import VLMFamily

    from mm_pack_lumina_mgpt.pictures import picture_token_ids

    codes, _ = picture_token_ids(family.config(upstream["download"].output("model")))
    items, _ = VLMFamily.held_out(family, ctx, upstream)
    code_set = set(codes)
    items = [(name, s) for name, s in items if any(int(t) in code_set for t in s["labels"])]
    if not items:
        return text_result
    model = family.load_exported(upstream["export"].output("model")).float().eval()
    rows, hits = [], 0.0
    for name, sample in items:
        labels = sample["labels"].tolist()
        start = next(i for i, t in enumerate(labels) if t != -100)
        target = labels[start + 3 :]  # after <racm3:break> and the two size tokens, which the prompt gives
        prompt = sample["input_ids"][: start + 3].tolist()
        newline = target[[t in code_set for t in target].index(False)]  # the first row's end
        height, width = target.count(newline), target.index(newline)
        got = draw(family, model, prompt, height, width, codes, newline, target[height * (width + 1)])
        pairs = [(g, w) for g, w in zip(got, target) if w in code_set]
        score = sum(g == w for g, w in pairs) / max(1, len(pairs))
        hits += score
        rows.append({"item": name, "image_token_accuracy": score, "tokens": got})
    metrics = {**dict(text_result.metrics), "pictures": len(items), "image_token_accuracy": hits / len(items)}
    agreement = picture_colours(family, upstream, items, rows, code_set)
    if agreement is not None:
        metrics["colour_agreement"] = agreement
    ctx.stage_dir.mkdir(parents=True, exist_ok=True)
    (ctx.stage_dir / "pictures.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    note = f"{len(items)} held-out picture(s) drawn greedily by the export: {metrics['image_token_accuracy']:.1%} of their target image tokens reproduced" + (
        f", {agreement:.0%} in their caption's colour" if agreement is not None else ""
    )
    return StageResult(outputs={**dict(text_result.outputs), "pictures": "pictures.jsonl"}, metrics=metrics, notes=[*text_result.notes, note])


def picture_colours(family: Any, upstream: Any, items: list[Any], rows: list[dict[str, Any]], codes: set[int]) -> float | None:
    """The share of drawn pictures in their caption's colour (:mod:`mm_pack_lumina_mgpt.demo`), where captions name one."""
    from transformers import AutoTokenizer

    from mmcore.data import ShardDataset

    from mm_pack_lumina_mgpt.demo import code_colours, colour_agreement

    tokenizer = AutoTokenizer.from_pretrained(upstream["download"].output("model"))
    table = code_colours(ShardDataset(upstream["preprocess"].output("dataset")).split("train"), tokenizer, codes)
    prompts = [tokenizer.decode(s["input_ids"][: next(j for j, t in enumerate(s["labels"].tolist()) if t != -100)].tolist()) for _, s in items]
    agreement = colour_agreement(prompts, [r["tokens"] for r in rows], table)
    for row, prompt in zip(rows, prompts):
        from mm_pack_lumina_mgpt.demo import drawn_colour

        row["colour"] = drawn_colour(row["tokens"], table)
    return agreement
