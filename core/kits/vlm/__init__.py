"""The VLM kit: the stages of a transformers conversational model, from one declaration.

A pack describes its family once, as a :class:`VLMFamily` (the model class, how media reaches
the model, the token ids collation needs, what to shard and freeze); the family's methods are
the stage functions and parts its declared stages bind::

    FAMILY = VLMFamily(model_class="LlavaForConditionalGeneration", encoder=make_encoder, ...)

    STAGES = {
        "download": Stage("mmcore.engines.download:download_stage", parts={"build_init": "mm_pack_x.tiny:build_init_checkpoint"}),
        "convert": Stage("mmcore.engines.convert:convert_stage", parts={"adapter": "mm_pack_x.adapter:ADAPTER",
                                                               "build_model": "mm_pack_x.family:FAMILY.build_model"}),
        "preprocess": "mm_pack_x.family:FAMILY.preprocess",
        "train": Stage("mmcore.train:train_stage", parts={"recipe": "mm_pack_x.family:FAMILY.recipe"}),
        "export": "mm_pack_x.family:FAMILY.export",
        "evaluate": "mm_pack_x.family:FAMILY.evaluate",
        "infer": "mm_pack_x.family:FAMILY.infer",
    }

The kit's modules, one job each:

* :mod:`.family`: :class:`VLMFamily`, the declaration, and the model it builds and reloads.
* :mod:`.batches`: token ids, collation (padded or packed rows), forward, loss, FLOPs.
* :mod:`.stages`: preprocess (MLLM JSON through the pack's encoder) and export (a
  ``from_pretrained`` folder compared logit for logit; MindSpeed-MM's layout).
* :mod:`.recipe`: :class:`VLMRecipe`, the train engine's SFT recipe (and
  :class:`VLMMegatronRecipe` for a family that runs on megatron-core).
* :mod:`.dpo` and :mod:`.pairs`: :class:`VLMDPORecipe`, DPO on preference pairs.
* :mod:`.grpo`: :class:`~mmcore.kits.vlm.grpo.VLMGRPORecipe`, GRPO on prompts with references.
* :mod:`.generation`: evaluate (greedy answers to the held-out prompts) and ``mmcore infer``.
"""

from __future__ import annotations

from mmcore.kits.vlm.batches import Batch, CollateExtra, balance_loss_without_fillers, restarting_positions, rows_of, with_tail
from mmcore.kits.vlm.dpo import VLMDPORecipe
from mmcore.kits.vlm.family import EncoderFactory, VLMFamily
from mmcore.kits.vlm.generation import torch_tensor
from mmcore.kits.vlm.recipe import VLMMegatronRecipe, VLMRecipe

__all__ = [
    "VLMFamily",
    "VLMRecipe",
    "VLMMegatronRecipe",
    "VLMDPORecipe",
    "restarting_positions",
    "rows_of",
    "with_tail",
    "balance_loss_without_fillers",
    "torch_tensor",
    "Batch",
    "CollateExtra",
    "EncoderFactory",
]
