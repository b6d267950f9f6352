"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder in the layout of the public transformers-format
checkpoints (``deepseek-community/Janus-Pro-1B`` / ``-7B``, written by transformers' own
``save_pretrained``): config (a SigLIP-style vision tower and its aligner MLP, a Llama text
model, the VQ model with its generation embeddings, aligner and head), safetensors weights, a
byte-level tokenizer with Janus's special tokens (``<image_placeholder>``, ``<begin_of_image>``,
``<end_of_image>``, the ``<|User|>`` / ``<|Assistant|>`` turn words as plain text) that adds the
begin-of-sentence token as Janus's Llama tokenizer does, ``JanusProcessor`` on its PIL image
processor, its chat template, and the generation config image generation reads
(``boi_token_id``, ``pad_token_id``, ``guidance_scale``).

Sizes: the understanding tower sees ``image`` pixels in ``patch``-pixel patches, so an image
is ``(image / patch)^2`` tokens between ``<begin_of_image>`` and ``<end_of_image>``; the VQ
model compresses ``image`` pixels by 2^(levels - 1) to the same grid (the released model: 384
pixels, 16-pixel patches and 16x compression, 576 tokens), which is what transformers' config
ties together (``vq_config.num_patches`` = image / patch).
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
IMAGE, BOI, EOI = "<image_placeholder>", "<begin_of_image>", "<end_of_image>"

# The chat template transformers' conversion script gives JanusProcessor (deepseek-community's
# processor carries it): "<|User|>: ... \n\n<|Assistant|>: ...", images as <image_placeholder>,
# the end-of-sentence token between an answer and the next turn.
CHAT_TEMPLATE = (
    "{%set seps=['\n\n','<\uff5cend\u2581of\u2581sentence\uff5c>']%}"
    "{%set i=0%}"
    "{%for message in messages%}"
    "{%if message['role']|lower=='user'%}"
    "<|User|>: "
    "{%elif message['role']|lower=='assistant'%}"
    "<|Assistant|>:{%if not (loop.last and not add_generation_prompt and message['content'][0]['type']=='text' and message['content'][0]['text']=='')%} {%endif%}"
    "{%else%}"
    "{{message['role'].capitalize()}}: "
    "{%endif%}"
    "{%for content in message['content']%}"
    "{%if content['type']=='image'%}"
    "{%if not loop.first%}{{'\n'}}{%endif%}"
    "<image_placeholder>"
    "{%if not loop.last%}{{'\n'}}{%endif%}"
    "{%elif content['type']=='text'%}"
    "{%set text=content['text']%}"
    "{%if loop.first%}{%set text=text.lstrip()%}{%endif%}"
    "{%if loop.last%}{%set text=text.rstrip()%}{%endif%}"
    "{%if not loop.first and message['content'][loop.index0-1]['type']=='text'%}"
    "{{' '+text}}"
    "{%else%}"
    "{{text}}"
    "{%endif%}"
    "{%endif%}"
    "{%endfor%}"
    "{%if not loop.last or add_generation_prompt%}"
    "{%if message['role']|lower=='user'%}"
    "{{seps[0]}}"
    "{%else%}"
    "{{seps[1]}}"
    "{%endif%}"
    "{%endif%}"
    "{%endfor%}"
    "{%if add_generation_prompt%}<|Assistant|>:{%endif%}"
)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful language and vision assistant. You are able to understand the visual content that the user provides, and assist the user with a variety of tasks using natural language.\n\n"
)

# Words the tiny tokenizer learns whole: the demo's vocabulary, Janus's system prompt, chat text.
CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "The shape is red. The shape is green. The shape is blue. The shape is yellow. a red square a blue circle a green triangle",
    "red green blue yellow triangle square circle user assistant system image picture text word <|User|>: <|Assistant|>:",
    DEFAULT_SYSTEM_PROMPT,
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# image / patch: the understanding tower's input and patch (tokens per image: (image / patch)^2);
# vq_levels: the VQ model's channel multipliers (2^(len - 1) compression, to the same grid);
# system_prompt: the processor's use_default_system_prompt (the released processor: on)
PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "vision": 32, "image": 32, "patch": 8, "vq_levels": [1, 1, 2, 2], "codebook": 64, "system_prompt": True},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "vision": 48, "image": 32, "patch": 8, "vq_levels": [1, 1, 2, 2], "codebook": 64, "system_prompt": False},
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer with Janus's special tokens, adding the begin-of-sentence
    token in front of every text as Janus's Llama tokenizer does."""
    from tokenizers.processors import TemplateProcessing

    from mmcore.engines import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(CORPUS, [IMAGE, BOI, EOI], vocab_size=400, eos=EOS, pad=PAD, bos=BOS, chat_template=CHAT_TEMPLATE)
    bos = tokenizer.convert_tokens_to_ids(BOS)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)])
    tokenizer._set_model_specific_special_tokens({"image_token": IMAGE, "boi_token": BOI, "eoi_token": EOI})  # JanusProcessor reads them by name
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    """The transformers config of a tiny preset, its token ids taken from ``tokenizer``."""
    from transformers import JanusConfig

    p = pick_preset(PRESETS, preset)
    grid = p["image"] // p["patch"]
    vision = dict(
        hidden_size=p["vision"],
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=p["image"],
        patch_size=p["patch"],
        mlp_ratio=2.0,
        projection_dim=p["hidden"],
        depth=2,
        num_image_tokens=grid * grid,
    )
    vq = dict(
        embed_dim=8,
        num_embeddings=p["codebook"],
        latent_channels=32,
        base_channels=32,  # the VQ model's GroupNorms take 32 groups
        channel_multiplier=p["vq_levels"],
        num_res_blocks=1,
        projection_dim=p["hidden"],
        image_token_embed_dim=p["hidden"],
    )
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["heads"],
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return JanusConfig(text_config={"model_type": "llama", **text}, vision_config=vision, vq_config=vq, image_token_id=tokenizer.convert_tokens_to_ids(IMAGE))


def build_processor(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    """``JanusProcessor`` on its PIL image processor (no torchvision), sized to the tiny tower."""
    from transformers import JanusImageProcessorPil, JanusProcessor

    p = pick_preset(PRESETS, preset)
    grid = p["image"] // p["patch"]
    images = JanusImageProcessorPil(size={"height": p["image"], "width": p["image"]})
    return JanusProcessor(images, tokenizer, chat_template=CHAT_TEMPLATE, use_default_system_prompt=p["system_prompt"], num_image_tokens=grid * grid)


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, processor) into ``out``."""
    import torch
    from transformers import JanusForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config)
    # what image generation reads (as transformers' conversion script sets it for the released model)
    model.generation_config.boi_token_id = tokenizer.convert_tokens_to_ids(BOI)
    model.generation_config.generation_kwargs = {"boi_token_id": tokenizer.convert_tokens_to_ids(BOI)}  # where generate(generation_mode="image") reads it
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.guidance_scale = 5
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_processor(preset, tokenizer).save_pretrained(out)
