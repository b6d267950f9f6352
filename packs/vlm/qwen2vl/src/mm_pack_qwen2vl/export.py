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
    from mm_pack_qwen2vl.model import TokenIds, build_model, collate, model_class
    from mmcore.convert import copy_side_files, dcp_to_hf
    from mmcore.data.shards import ShardDataset

    model_dir = upstream["download"].output("model")
    checkpoint = upstream["train"].output("checkpoint").resolve()
    out = ctx.stage_dir / "hf"
    dtype = None if ctx.config.export.dtype in ("auto", "float32") else getattr(torch, ctx.config.export.dtype)
    stats = dcp_to_hf(checkpoint, out, ADAPTER, dtype=dtype)
    copy_side_files(model_dir, out)

    # The export must reproduce the trained model exactly.
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held_out = data.split("eval")
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


def generate_accuracy(model: Any, folder: Any, held_out: Any, ids: Any) -> float:
    """Greedy ``generate()`` of the export on the held-out prompts (transformers' own path)."""
    import torch
    from transformers import AutoTokenizer

    from mmcore.causal_lm import generate_accuracy as accuracy

    def prompt_inputs(sample: dict[str, Any], start: int) -> dict[str, Any]:
        prompt = sample["input_ids"][:start][None]
        types = (prompt == ids.image).long() + 2 * (prompt == ids.video).long()
        inputs = {"input_ids": prompt, "attention_mask": torch.ones(1, start, dtype=torch.long), "mm_token_type_ids": types}
        inputs.update({k: sample[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw") if k in sample})
        return inputs

    end = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<|im_end|>")
    return accuracy(model, held_out, prompt_inputs, end, ids.pad)
