"""Export: the trained checkpoint as a folder ``from_pretrained`` loads, checked against training.

After writing, the export reloads with plain transformers and compares logits with the model
built from the training checkpoint; on a held-out split it also answers by ``generate()``.
"""

from __future__ import annotations

from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from transformers import AutoConfig

    from mm_pack_qwen2vl.adapter import ADAPTER
    from mm_pack_qwen2vl.model import TokenIds, collate
    from mm_pack_qwen2vl.modeling import build_model, model_class
    from mmcore.data.shards import ShardDataset
    from mmcore.export import export_checked

    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held_out = data.split("eval")
    probe = held_out if len(held_out) else data
    ids = TokenIds.of(data)
    batch = collate([probe[i] for i in range(min(4, len(probe)))], ids)
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "num_loss_tokens")}
    done = export_checked(
        ctx, upstream, ADAPTER, build_trained=build_model,
        load_exported=lambda out: model_class(AutoConfig.from_pretrained(out)).from_pretrained(out, attn_implementation="sdpa"),
        probe=inputs, logits=lambda model, b: model(**b, use_cache=False).logits,
    )
    if len(held_out):
        accuracy = generate_accuracy(done.loaded, done.folder, held_out, ids)
        done.metrics["generate_accuracy"] = accuracy
        done.notes.append(f"held-out accuracy of the export with transformers generate(): {accuracy:.1%}")
    return StageResult(outputs={"model": "hf"}, metrics=done.metrics, notes=done.notes)


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
