"""Export: the trained thinker as a folder ``from_pretrained`` loads, checked against training.

After writing, the export reloads with plain transformers
(``Qwen2_5OmniThinkerForConditionalGeneration``) and compares logits with the model built from
the training checkpoint on held-out samples with their images and audio; it then answers the
held-out questions by ``generate()``.
"""

from __future__ import annotations

from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.errors import StageError
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    import torch
    from transformers import AutoTokenizer, Qwen2_5OmniThinkerForConditionalGeneration

    from mm_pack_qwen2_5omni.adapter import ADAPTER
    from mm_pack_qwen2_5omni.model import TokenIds, build_model, collate, forward_logits
    from mmcore.causal_lm import generate_accuracy
    from mmcore.convert import copy_side_files, dcp_to_hf
    from mmcore.data.shards import ShardDataset

    model_dir = upstream["download"].output("model")
    checkpoint = upstream["train"].output("checkpoint").resolve()
    out = ctx.stage_dir / "hf"
    dtype = None if ctx.config.export.dtype in ("auto", "float32") else getattr(torch, ctx.config.export.dtype)
    stats = dcp_to_hf(checkpoint, out, ADAPTER, dtype=dtype)
    copy_side_files(model_dir, out)

    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held_out = data.split("eval")
    probe = held_out if len(held_out) else data
    ids = TokenIds.of(data)
    batch = collate([probe[i] for i in range(min(4, len(probe)))], ids)
    trained = build_model(model_dir, checkpoint).eval()
    loaded = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(out, attn_implementation="sdpa").eval()
    with torch.no_grad():
        a, b = forward_logits(trained, batch), forward_logits(loaded, batch)
    max_diff = float((a.float() - b.float()).abs().max())
    if dtype is None and max_diff != 0.0:
        raise StageError(f"the exported model's logits differ from the trained model's (max |diff| {max_diff:.3g})")
    metrics: dict[str, Any] = {**stats, "logits_max_abs_diff": max_diff}
    notes = [f"exported to {out} ({stats['shards']} shard(s)); reloaded with transformers: logits max |diff| = {max_diff:.3g}"]
    if len(held_out):
        def prompt_inputs(sample: dict[str, Any], start: int) -> dict[str, Any]:
            prompt = dict(sample, input_ids=sample["input_ids"][:start], labels=sample["labels"][:start])
            return {k: v for k, v in collate([prompt], ids).items() if k not in ("labels", "num_loss_tokens")}

        end = AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<|im_end|>")
        accuracy = generate_accuracy(loaded, held_out, prompt_inputs, end, ids.pad)
        metrics["generate_accuracy"] = accuracy
        notes.append(f"held-out accuracy of the export with transformers generate(): {accuracy:.1%}")
    return StageResult(outputs={"model": "hf"}, metrics=metrics, notes=notes)
