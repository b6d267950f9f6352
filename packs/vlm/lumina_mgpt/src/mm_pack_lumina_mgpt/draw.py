"""The evaluate stage's held-out text -> image items: the export draws each picture greedily in
Lumina's layout (size tokens from the prompt's target, then codes row by row with new-lines),
scored by the share of the target's code tokens it reproduces. transformers' Chameleon has no
VQ decoder (Lumina-mGPT decodes with Meta's original VQGAN checkpoint), so the drawn tokens are
written to ``pictures.jsonl``, not decoded to pixels."""

from __future__ import annotations

import json
from typing import Any


def draw(family: Any, model: Any, prompt: list[int], length: int) -> list[int]:
    """``length`` tokens after ``prompt``, greedily, through the family's logits (image codes unmasked inside pictures)."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(length):
            batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
            ids.append(int(family.forward_logits(model, batch)[0, -1].argmax()))
    return ids[len(prompt) :]


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
        got = draw(family, model, prompt, len(target))
        pairs = [(g, w) for g, w in zip(got, target) if w in code_set]
        score = sum(g == w for g, w in pairs) / max(1, len(pairs))
        hits += score
        rows.append({"item": name, "image_token_accuracy": score, "tokens": got})
    ctx.stage_dir.mkdir(parents=True, exist_ok=True)
    (ctx.stage_dir / "pictures.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {**dict(text_result.metrics), "pictures": len(items), "image_token_accuracy": hits / len(items)}
    note = f"{len(items)} held-out picture(s) drawn greedily by the export: {metrics['image_token_accuracy']:.1%} of their target image tokens reproduced"
    return StageResult(outputs={**dict(text_result.outputs), "pictures": "pictures.jsonl"}, metrics=metrics, notes=[*text_result.notes, note])
