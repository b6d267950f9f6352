"""The VLM kit's data and export stages, as methods of :class:`~mmcore.kits.vlm.VLMFamily`
(a pack's stages name them: ``"preprocess": "mm_pack_x.family:FAMILY.preprocess"``).

* **preprocess**: MLLM JSON through the pack's encoder (a
  :class:`~mmcore.data.chat_template.ChatTemplateEncoder`), the ids of ``tokens`` recorded in
  the dataset index, each sample's tokens through the towers (``towers``) beside it.
* **export**: the trained checkpoint as a ``from_pretrained`` folder, reloaded by the model
  class and compared logit for logit; with ``export.format: mindspeed-mm`` also MindSpeed-MM's
  layout, through the family's Megatron table
  (:class:`~mmcore.backends.megatron.family.MegatronTable`).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Mapping

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.engines.download import remote_code
from mmcore.kits.vlm.pairs import chosen_view
from mmcore.framework.pack import StageResult
from mmcore.run.rundir import Manifest

if TYPE_CHECKING:
    from mmcore.kits.vlm.family import VLMFamily


class VLMStages:
    """The preprocess and export stages of :class:`~mmcore.kits.vlm.VLMFamily` (a mixin)."""

    def preprocess(self: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        from transformers import AutoTokenizer

        from mmcore.data.conversations import preprocess_conversations

        model_dir = upstream["download"].output("model")
        tokenizer = AutoTokenizer.from_pretrained(model_dir, **remote_code())
        demo = self.preference_demo if getattr(ctx.config.data, "ranking", False) else self.demo
        ids = self.token_ids_of(tokenizer)
        return preprocess_conversations(ctx, self.encoder(ctx, model_dir, tokenizer), demo=demo, tokenizer=str(model_dir), tower_tokens=lambda tensors: self.tower_tokens(tensors, ids), **ids)

    def export(self: "VLMFamily", ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
        """Write the export and prove it reproduces the trained logits (the evaluate stage then
        answers the held-out prompts with it)."""
        from mmcore.data.shards import ShardDataset
        from mmcore.engines.export import export_checked
        from mmcore.kits.vlm.family import megatron_table_of

        data = ShardDataset(upstream["preprocess"].output("dataset"))
        held_out = data.split("eval")
        probe = held_out if len(held_out) else data
        kind = self.group_of(probe)
        same_kind = list(itertools.islice((i for i in range(len(probe)) if kind(i) == kind(0)), 4))  # batch_apart: one kind per forward
        done = export_checked(
            ctx,
            upstream,
            self.adapter,
            build_trained=self.build_model,
            load_exported=self.load_exported,
            probe=self.collate([chosen_view(probe[i]) for i in same_kind], self.token_ids(data)),
            logits=self.forward_logits,
            side_files=self.export_side_files,
        )
        outputs, metrics, notes = dict(done.outputs), dict(done.metrics), list(done.notes)
        if getattr(ctx.config.export, "format", "hf") == "mindspeed-mm":
            from mmcore.backends.megatron.mindspeed_mm import export_mindspeed

            table = megatron_table_of(self)
            if table is None:
                raise StageError(f"export.format=mindspeed-mm: the {ctx.pack} pack has no Megatron table")
            more_outputs, more_metrics, more_notes = export_mindspeed(ctx, ctx.stage_dir / done.outputs["model"], table)
            outputs.update(more_outputs)
            metrics.update(more_metrics)
            notes.extend(more_notes)
        return StageResult(outputs=outputs, metrics=metrics, notes=notes)


__all__ = ["VLMStages"]
