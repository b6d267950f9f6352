"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder that ``from_pretrained`` and
``DeepseekOcr2Processor`` load: config (the real config's fields: a SAM ViT with windowed and
global layers, its neck and two stride-2 convolutions, the Qwen2-style query encoder, and a
DeepSeek-MoE decoder whose first layer is dense and the rest sparse with shared experts),
safetensors weights, a byte-level tokenizer with DeepSeek's special tokens and ``<image>``,
the PIL image processor and the chat template.

Sizes: the model's learnable queries are 144 (12 x 12, the 768-pixel tile) or 256 (16 x 16,
the 1024-pixel global view), whatever the config, so the SAM grid after the 4x downsampling
must be 12 x 12 or 16 x 16. A 2-pixel SAM patch keeps those grids at 96- and 128-pixel images
(the released model: 16-pixel patches, 768 and 1024), so ``tiny`` has 128-pixel global views and
96-pixel tiles (images wider than 96 pixels are cropped into tiles, as the released processor
crops past 768), and ``demo`` 96-pixel global views only. The model takes any SAM grid of at
most 144 cells for the 144 queries (only the processor's count ties the two), so ``demo``'s SAM
reads 8-pixel patches (a 3 x 3 grid after downsampling, 144 tokens still): a CPU demo, not the
released geometry, which ``tiny`` keeps.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

SAM_PATCH, DOWNSAMPLE = 2, 4
BOS, EOS, PAD, IMAGE = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<image>"

# DeepSeek-OCR's conversation format ("<|User|>" / "<|Assistant|>" turns, the answer closed by
# the end-of-sentence token), for tokenizers that carry no template of their own.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] if c['type'] == 'text' %}{{ c['text'] }}{% endfor %}{% endif %}{{ '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|User|>: ' }}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}{{ '<image>\n' }}{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{{ '\n\n' }}"
    "{% else %}{{ '<|Assistant|>: ' }}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] if c['type'] == 'text' %}{{ c['text'] }}{% endfor %}{% endif %}{{ eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|Assistant|>: ' }}{% endif %}"
)

# Words the tiny tokenizer learns whole: the demo's vocabulary plus common chat text.
CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "The shape is red. The shape is green. The shape is blue. The shape is yellow. Free OCR. Convert the document to markdown.",
    "red green blue yellow triangle square circle user assistant system image picture text word read",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

# global / tile: the image processor's ``size`` and ``tile_size`` (128 -> 16 x 16 queries, 96 -> 12 x 12)
# sam_patch: the SAM's own patch (the processor counts tokens with SAM_PATCH); global_layers:
# SAM layers with global attention (the released model: 4 of 12, over a 64 x 64 grid: too slow
# for a CPU test at one thread, so the tiny SAMs are windowed only)
PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "sam_dim": 32, "sam_layers": 2, "sam_patch": SAM_PATCH, "global_layers": [], "encoder_dim": 48, "global": 128, "tile": 96},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "sam_dim": 32, "sam_layers": 2, "sam_patch": 8, "global_layers": [1], "encoder_dim": 48, "global": 96, "tile": 96},
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer with DeepSeek-OCR-2's special tokens (bos, eos, pad) and ``<image>``."""
    from mmcore.engines import byte_level_tokenizer

    tokenizer = byte_level_tokenizer(CORPUS, [IMAGE], vocab_size=384, eos=EOS, pad=PAD, bos=BOS, chat_template=CHAT_TEMPLATE)
    tokenizer.add_bos_token = False  # the template writes it
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    """The transformers config of a tiny preset, its token ids taken from ``tokenizer``."""
    from transformers import DeepseekOcr2Config

    p = pick_preset(PRESETS, preset)
    sam = dict(
        hidden_size=p["sam_dim"],
        num_hidden_layers=p["sam_layers"],
        num_attention_heads=2,
        image_size=p["global"],
        patch_size=p["sam_patch"],
        output_channels=p["sam_dim"],
        window_size=8,
        global_attn_indexes=p["global_layers"],
        downsample_channels=[p["sam_dim"], p["encoder_dim"]],
        mlp_ratio=2.0,
        initializer_range=0.02,  # the config's default (1e-10, for loading trained weights) leaves a random SAM near zero: no signal
    )
    encoder = dict(hidden_size=p["encoder_dim"], intermediate_size=2 * p["encoder_dim"], num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=16, max_position_embeddings=1024)
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["heads"],
        max_position_embeddings=4096,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=p["hidden"] // 2,
        mlp_layer_types=["dense"] + ["sparse"] * (p["layers"] - 1),  # as the released model: first layer dense
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return DeepseekOcr2Config(vision_config={"sam_config": sam, "encoder_config": encoder}, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids(IMAGE))


def image_processor(preset: str):  # type: ignore[no-untyped-def]
    """DeepSeek-OCR-2's PIL image processor (no torchvision) sized to the tiny SAM."""
    from transformers import DeepseekOcr2ImageProcessorPil

    p = pick_preset(PRESETS, preset)
    return DeepseekOcr2ImageProcessorPil(size={"height": p["global"], "width": p["global"]}, tile_size=p["tile"])


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, processor) into ``out``."""
    import torch
    from transformers import DeepseekOcr2ForConditionalGeneration, DeepseekOcr2Processor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar for a one-shard save of a tiny model is noise
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = DeepseekOcr2ForConditionalGeneration(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    DeepseekOcr2Processor(image_processor=image_processor(preset), tokenizer=tokenizer, chat_template=CHAT_TEMPLATE, patch_size=SAM_PATCH, downsample_ratio=DOWNSAMPLE).save_pretrained(out)
