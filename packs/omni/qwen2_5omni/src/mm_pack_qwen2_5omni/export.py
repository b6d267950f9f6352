"""Export: the trained thinker as a folder ``from_pretrained`` loads, checked against training.

After writing, the export reloads with plain transformers
(``Qwen2_5OmniThinkerForConditionalGeneration``) and compares logits with the model built from
the training checkpoint on held-out samples with their images and audio; it then answers the
held-out questions by ``generate()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def thinker_side_files(model_dir: Path, out: Path) -> None:
    """Tokenizer and processor files as they are; the config is the thinker's alone (a full
    Omni folder's config describes the talker and vocoder too, whose weights are not exported)."""
    from transformers import Qwen2_5OmniThinkerConfig

    from mmcore.convert import copy_side_files

    copy_side_files(model_dir, out)
    Qwen2_5OmniThinkerConfig.from_pretrained(model_dir).save_pretrained(out)


def export(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from transformers import AutoTokenizer, Qwen2_5OmniThinkerForConditionalGeneration

    from mm_pack_qwen2_5omni.adapter import ADAPTER
    from mm_pack_qwen2_5omni.model import TokenIds, build_model, collate, forward_logits
    from mmcore.causal_lm import generate_accuracy
    from mmcore.data.shards import ShardDataset
    from mmcore.export import export_checked

    data = ShardDataset(upstream["preprocess"].output("dataset"))
    held_out = data.split("eval")
    probe = held_out if len(held_out) else data
    ids = TokenIds.of(data)
    done = export_checked(
        ctx, upstream, ADAPTER, build_trained=build_model,
        load_exported=lambda out: Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(out, attn_implementation="sdpa"),
        probe=collate([probe[i] for i in range(min(4, len(probe)))], ids), logits=forward_logits,
        side_files=thinker_side_files,
    )
    if len(held_out):
        def prompt_inputs(sample: dict[str, Any], start: int) -> dict[str, Any]:
            prompt = dict(sample, input_ids=sample["input_ids"][:start], labels=sample["labels"][:start])
            return {k: v for k, v in collate([prompt], ids).items() if k not in ("labels", "num_loss_tokens")}

        end = AutoTokenizer.from_pretrained(done.folder).convert_tokens_to_ids("<|im_end|>")
        accuracy = generate_accuracy(done.loaded, held_out, prompt_inputs, end, ids.pad)
        done.metrics["generate_accuracy"] = accuracy
        done.notes.append(f"held-out accuracy of the export with transformers generate(): {accuracy:.1%}")
    return StageResult(outputs={"model": "hf"}, metrics=done.metrics, notes=done.notes)
