"""Tiny random-weight checkpoints built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder that ``from_pretrained`` and
``InternVLProcessor`` load: config (an InternViT of 56-pixel tiles, 4 tokens per tile after the
pixel shuffle, and a Qwen2 decoder), safetensors weights, a small byte-level BPE Qwen2 tokenizer
with InternVL's named image tokens, the image processor and the chat template.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

TILE, PATCH = 56, 14
NAMED_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}
SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", *NAMED_TOKENS.values()]

# Words the tiny tokenizer learns whole: the demo's vocabulary plus common chat text.
CORPUS = [
    "What colour is the shape? What colour is the triangle? What colour is the square? What colour is the circle?",
    "The shape is red. The shape is green. The shape is blue. The shape is yellow. Frame1: Frame2: Frame3: Frame4:",
    "red green blue yellow triangle square circle user assistant system image video picture",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_layers": 2, "vision_dim": 32},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "kv_heads": 2, "vision_layers": 2, "vision_dim": 48},
}


def build_tokenizer(vocab_size: int = 384):  # type: ignore[no-untyped-def]
    """A Qwen2 tokenizer over a small byte-level BPE, with InternVL's image tokens as named attributes."""
    from transformers import Qwen2Tokenizer

    from mmcore.engines import train_byte_level_bpe

    vocab, merges = train_byte_level_bpe(CORPUS, vocab_size)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", extra_special_tokens=NAMED_TOKENS)
    tokenizer.add_tokens(["<|endoftext|>"], special_tokens=True)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    from transformers import InternVLConfig

    p = pick_preset(PRESETS, preset)
    text = dict(
        model_type="qwen2",
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    vision = dict(hidden_size=p["vision_dim"], num_hidden_layers=p["vision_layers"], num_attention_heads=2, intermediate_size=2 * p["vision_dim"], image_size=TILE, patch_size=PATCH)
    return InternVLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=(TILE // PATCH) ** 2 // 4,
        downsample_ratio=0.5,
        tie_word_embeddings=False,
    )


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, image processor) into ``out``."""
    import torch
    from transformers import InternVLForConditionalGeneration
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    from transformers.utils import logging as hf_logging

    from mm_pack_internvl.data import CHAT_TEMPLATE

    hf_logging.disable_progress_bar()  # a bar for a one-shard save of a tiny model is noise
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = InternVLForConditionalGeneration(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    # InternVL's tiles: ImageNet statistics, 12 tiles at most (max_dynamic_patch)
    GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True, max_patches=12, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(out)
