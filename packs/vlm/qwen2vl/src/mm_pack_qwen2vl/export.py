"""Export: the trained checkpoint as a folder ``from_pretrained`` loads, checked against training.

After writing, the export reloads with plain transformers and compares logits with the model
built from the training checkpoint; on a held-out split it also answers by ``generate()``.
"""

from __future__ import annotations

from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch

    from mm_pack_qwen2vl.adapter import ADAPTER
    from mm_pack_qwen2vl.model import TokenIds, build_model, collate, model_class, split
    from mm_pack_qwen2vl.pack import copy_side_files
    from mmcore.convert import dcp_to_hf
    from mmcore.data.shards import ShardDataset

    model_dir = upstream["download"].output("model")
    checkpoint = upstream["train"].output("checkpoint").resolve()
    out = ctx.stage_dir / "hf"
    dtype = None if ctx.config.export.dtype in ("auto", "float32") else getattr(torch, ctx.config.export.dtype)
    stats = dcp_to_hf(checkpoint, out, ADAPTER, dtype=dtype)
    copy_side_files(model_dir, out)

    # The export must reproduce the trained model exactly.
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held_out = split(data, "eval")
    probe = held_out if len(held_out) else data
    ids = TokenIds.of(data)
    batch = collate([probe[i] for i in range(min(4, len(probe)))], ids)
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "num_loss_tokens")}
    trained = build_model(model_dir, checkpoint).eval()
    from transformers import AutoConfig

    loaded = model_class(AutoConfig.from_pretrained(out)).from_pretrained(out, attn_implementation="sdpa").eval()
    with torch.no_grad():
        a = trained(**inputs, use_cache=False).logits
        b = loaded(**inputs, use_cache=False).logits
    max_diff = float((a.float() - b.float()).abs().max())
    if dtype is None and max_diff != 0.0:
        raise StageError(f"the exported model's logits differ from the trained model's (max |diff| {max_diff:.3g})")
    metrics: dict[str, Any] = {**stats, "logits_max_abs_diff": max_diff}
    notes = [f"exported to {out} ({stats['shards']} shard(s)); reloaded with transformers: logits max |diff| = {max_diff:.3g}"]
    if len(held_out):
        accuracy = generate_accuracy(loaded, out, held_out, ids)
        metrics["generate_accuracy"] = accuracy
        notes.append(f"held-out accuracy of the export with transformers generate(): {accuracy:.1%}")
    return StageResult(outputs={"model": "hf"}, metrics=metrics, notes=notes)


def generate_accuracy(model: Any, folder: Any, held_out: Any, ids: Any, limit: int = 64) -> float:
    """Greedy ``generate()`` on each held-out prompt; correct when it reproduces the answer."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    correct = total = 0
    for i in range(min(limit, len(held_out))):
        sample = held_out[i]
        labels = sample["labels"]
        supervised = (labels != -100).nonzero().flatten()
        start = int(supervised[0])  # first answer token: the prompt ends just before it
        answer = sample["input_ids"][start : int(supervised[-1]) + 1].tolist()
        prompt = sample["input_ids"][:start][None]
        types = (prompt == ids.image).long() + 2 * (prompt == ids.video).long()
        inputs = {"input_ids": prompt, "attention_mask": torch.ones(1, start, dtype=torch.long), "mm_token_type_ids": types}
        for name in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
            if name in sample:
                inputs[name] = sample[name]
        with torch.no_grad():
            generated = model.generate(**inputs, max_new_tokens=len(answer) + 2, do_sample=False, eos_token_id=end, pad_token_id=ids.pad)
        produced = generated[0, start:].tolist()
        correct += int(produced[: len(answer)] == answer)
        total += 1
    return correct / max(total, 1)
