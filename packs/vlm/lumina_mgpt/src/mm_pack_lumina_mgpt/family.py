"""Lumina-mGPT as the VLM kit sees it: transformers' ``ChameleonForConditionalGeneration``, the
adapter for Lumina's checkpoints (:mod:`mm_pack_lumina_mgpt.adapter`), ``ChameleonProcessor``
as the image expander, Lumina's conversation template, and the text -> image direction in
Lumina's picture layout (:mod:`mm_pack_lumina_mgpt.pictures`). The kit does preprocessing,
collation, packing, loss, training and export.

The family: one decoder (Llama-like, 1-D RoPE, per-head q/k LayerNorm) over one vocabulary that
holds text and the VQ model's codes; an image question's picture is encoded by the frozen VQ
encoder inside the model's forward (``<image>`` placeholders replaced by its code tokens'
embeddings). Packed rows restart positions per sample and need nothing family-specific.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from mmcore import StageContext
from mmcore.config import RunConfig
from mmcore.data import MLLMDataSection, write_shape_preferences

from mm_pack_lumina_mgpt.adapter import LuminaAdapter
from mm_pack_lumina_mgpt.demo import write_caption_pictures


class LuminaRunConfig(RunConfig):
    data: MLLMDataSection = Field(default_factory=MLLMDataSection)


ADAPTER = LuminaAdapter()

# The VQ model never trains (it only turns pictures into codes); "llm" is the decoder and head.
FREEZE_GROUPS = {"vq": ["model.vqmodel.*"], "llm": ["model.embed_tokens.*", "model.layers.*", "model.norm.*", "lm_head.*"]}
LORA_TARGETS = ("model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj")


def processor(model_dir: Path) -> Any:
    """The family's processor on its PIL image processor (the default one needs torchvision)."""
    from transformers import ChameleonImageProcessorPil, ChameleonProcessor

    return ChameleonProcessor.from_pretrained(model_dir, image_processor=ChameleonImageProcessorPil.from_pretrained(model_dir))


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mmcore.kits import ProcessorImages

    from mm_pack_lumina_mgpt.pictures import LuminaEncoder

    proc = processor(model_dir)
    images = ProcessorImages(proc, return_for_text_completion=True)  # one image's tokens alone, no separator
    return LuminaEncoder(
        tokenizer,
        {"<image>": images},
        markers={"<image>": proc.image_token},
        chat_template=tokenizer.chat_template,
        train_on_prompt=ctx.config.data.train_on_prompt,
        media_token_ids=[proc.image_token_id],
        content="text",
        model_dir=model_dir,
        image_processor=proc.image_processor,
    )


def image_codes(batch: dict[str, Any]) -> float:
    pixels = batch.get("pixel_values")
    return 0.0 if pixels is None else float(pixels.shape[0] * (pixels.shape[-1] // 16) * (pixels.shape[-2] // 16))


def build_family() -> Any:
    from mm_pack_lumina_mgpt.pictures import LuminaFamily

    return LuminaFamily(
        model_class="ChameleonForConditionalGeneration",
        encoder=encoder,
        adapter=ADAPTER,
        media_fields=("pixel_values",),
        tokens={"image_token_id": "<image>"},
        freeze_groups=FREEZE_GROUPS,
        shard_layers=("model.layers",),
        towers={"model.vqmodel": image_codes},
        demo=write_caption_pictures,  # text -> picture, the family's main use
        preference_demo=write_shape_preferences,
        lora_targets=LORA_TARGETS,
        end_token="<reserved08706>",
    )


FAMILY = build_family()
