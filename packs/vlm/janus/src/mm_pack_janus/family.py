"""Janus-Pro as the VLM kit sees it: the model class, the state-dict adapter, the processor as
the image expander and the chat template, the frozen-vision cache, and the second direction:
text -> image tokens through the generation head (:mod:`mm_pack_janus.images`). The kit
(:mod:`mmcore.kits.vlm`) does preprocessing, collation, packing, loss, training and export.

The family: a SigLIP-style ViT (no class token, learnt positions) whose patch features an MLP
aligner maps into a Llama decoder (1-D RoPE, so packed rows restart their positions per sample
and need nothing family-specific); an image is ``<begin_of_image>``, one
``<image_placeholder>`` per patch, ``<end_of_image>``. For generation a VQ model (frozen, as
Janus trains it) turns a picture into a grid of codebook ids; the decoder reads them through
its own generation embeddings and aligner and predicts them with a separate generation head
(not the text ``lm_head``).

Checkpoint layout: the transformers-format checkpoints (``deepseek-community/Janus-Pro-1B`` /
``-7B``) were written by transformers' conversion script with ``save_pretrained``, and
transformers registers no conversion mapping for ``janus``: the hub names are the model's own.
deepseek-ai's remote-code layout (``gen_vision_model``, fused ``qkv``) is not read here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field

from mmcore import Manifest, StageContext
from mmcore.config import GenerationSection, RunConfig
from mmcore.data import MLLMDataSection, write_shape_preferences, write_shape_questions
from mmcore.engines import RenameAdapter
from mmcore.kits import VLMFamily


class JanusGeneration(GenerationSection):
    """Generation options plus what Janus makes: text answers, or a picture."""

    output: Literal["text", "image"] = Field("text", description="infer: text answers, or (image) a picture per prompt through the generation head and the VQ decoder, written as a PNG.")


class JanusRunConfig(RunConfig):
    data: MLLMDataSection = Field(default_factory=MLLMDataSection)
    generation: JanusGeneration = Field(default_factory=JanusGeneration)


# The hub names are the model's (no conversion mapping for janus in transformers); lm_head is
# tied to the text embedding where the config says so (the kit's coverage check reads the model).
ADAPTER = RenameAdapter(rules=[])

# training.freeze accepts these names as well as parameter globs. The VQ model never trains
# (it only turns target pictures into ids in preprocess and ids into pictures when generating).
FREEZE_GROUPS = {
    "vision": ["model.vision_model.*"],
    "projector": ["model.aligner.*"],
    "generation": ["model.generation_embeddings.*", "model.generation_aligner.*", "model.generation_head.*"],
    "vq": ["model.vqmodel.*"],
    "llm": ["model.language_model.*", "lm_head.*"],
}

# LoRA's default layers: the decoder's attention and MLP projections.
LORA_TARGETS = ("model.language_model.layers.*.self_attn.*_proj", "model.language_model.layers.*.mlp.*_proj")


def processor(model_dir: Path) -> Any:
    """The family's processor on its PIL image processor (the default one needs torchvision)."""
    from transformers import JanusImageProcessorPil, JanusProcessor

    return JanusProcessor.from_pretrained(model_dir, image_processor=JanusImageProcessorPil.from_pretrained(model_dir))


def templates(tokenizer: Any, proc: Any) -> tuple[str, str]:
    """(the training template, the image-generation prompt template), from the tokenizer's chat
    template or, where it has none, the processor's (deepseek-community's carries it there).

    JanusProcessor tokenizes with the begin-of-sentence token in front and, for text answers
    with ``use_default_system_prompt``, its default system prompt before the conversation: both
    become part of the template, so the kit's encoder writes what the processor writes. The
    template leaves out the end-of-sentence token after the *last* answer of a conversation
    (nothing follows it at inference); Janus's own SFT format closes every answer with it, and
    so does the training template here, or a trained model would never stop.
    """
    from transformers.models.janus.processing_janus import DEFAULT_SYSTEM_PROMPT

    from mmcore.errors import StageError

    template = getattr(tokenizer, "chat_template", None) or getattr(proc, "chat_template", None)
    closing = "{%if not loop.last or add_generation_prompt%}"
    if not template or closing not in template:
        raise StageError("the Janus tokenizer and processor carry no chat template of Janus's form (<|User|> / <|Assistant|> turns); save the processor's with the checkpoint")
    trained = template.replace(closing, "{%if not loop.last or add_generation_prompt or message['role']|lower=='assistant'%}", 1)
    system = DEFAULT_SYSTEM_PROMPT.replace("\n", "{{ '\\n' }}") if proc.use_default_system_prompt else ""
    return "{{ bos_token }}" + system + trained, "{{ bos_token }}" + template


def encoder(ctx: StageContext, model_dir: Path, tokenizer: Any) -> Any:
    from mmcore.kits import ProcessorImages

    from mm_pack_janus.images import JanusEncoder

    proc = processor(model_dir)
    trained, image_prompt = templates(tokenizer, proc)
    proc.use_default_system_prompt = False  # the system prompt is the template's: the expander asks for one image's tokens alone
    images = ProcessorImages(proc)
    return JanusEncoder(
        tokenizer,
        {"<image>": images},
        markers={"<image>": proc.image_token},
        chat_template=trained,
        train_on_prompt=ctx.config.data.train_on_prompt,
        media_token_ids=[tokenizer.convert_tokens_to_ids(proc.image_token)],
        model_dir=model_dir,
        image_prompt_template=image_prompt,
        image_processor=proc.image_processor,
        boi=proc.image_start_token,
    )


def prepare_model(ctx: StageContext, model: Any, upstream: Mapping[str, Manifest]) -> None:
    from mmcore.data import ShardDataset

    data = ShardDataset(upstream["preprocess"].output("dataset"))
    # data with pictures to generate: every step runs the generation path (times zero where its
    # batch has none), so all ranks give the same parameters gradients (mm_pack_janus.images.both_heads)
    model.janus_both_heads = any("image_tokens" in data.meta(i).get("media", ()) for i in range(len(data)))
    if "extract" in upstream:
        from mm_pack_janus.extract import use_cached_vision

        use_cached_vision(model)


def image_patches(batch: dict[str, Any]) -> float:
    """Patches through the understanding tower, counted in the released model's 16-pixel patches
    (the tiny presets' 8-pixel ones make this a relative measure there)."""
    pixels = batch.get("pixel_values")
    return 0.0 if pixels is None else float(pixels.shape[0] * (pixels.shape[-1] // 16) * (pixels.shape[-2] // 16))


def build_family() -> VLMFamily:
    from mm_pack_janus.images import JanusFamily

    return JanusFamily(
        model_class="JanusForConditionalGeneration",
        encoder=encoder,
        adapter=ADAPTER,
        media_fields=("pixel_values",),
        tokens={"image_token_id": "<image_placeholder>"},
        freeze_groups=FREEZE_GROUPS,
        shard_layers=("model.vision_model.encoder.layers", "model.language_model.layers"),
        prepare_model=prepare_model,
        towers={"model.vision_model": image_patches},
        demo=write_shape_questions,
        preference_demo=write_shape_preferences,
        lora_targets=LORA_TARGETS,
    )


FAMILY = build_family()
