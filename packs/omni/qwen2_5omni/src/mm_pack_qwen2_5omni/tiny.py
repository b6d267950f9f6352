"""Tiny random-weight Qwen2.5-Omni thinkers built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder that
``Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained`` loads: config, safetensors
weights, a small byte-level BPE tokenizer with the Omni special tokens (named as attributes:
the processor reads ``tokenizer.audio_token`` and friends), the image processor, the 128-mel
feature extractor and the chat template.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>", "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>"]
NAMED_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}

# Words the tiny tokenizer learns whole: the demo's vocabulary plus common chat text.
CORPUS = [
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory and visual inputs, as well as generating text and speech.",
    "What colour is the shape, and is the tone low, middle or high? What do you see and hear?",
    "red green blue yellow low middle high red low red middle red high green low blue high yellow middle",
    "triangle square circle image video audio sound picture",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32, "audio_dim": 32, "audio_layers": 2},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 48, "audio_dim": 48, "audio_layers": 2},
}


def build_tokenizer(vocab_size: int = 400):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Tokenizer

    from mmcore.engines import train_byte_level_bpe

    vocab, merges = train_byte_level_bpe(CORPUS, vocab_size)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", **NAMED_TOKENS)
    tokenizer.add_tokens(["<|endoftext|>"], special_tokens=True)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    from transformers import Qwen2_5OmniThinkerConfig

    p = pick_preset(PRESETS, preset)
    ids = tokenizer.convert_tokens_to_ids
    half = p["hidden"] // p["heads"] // 2  # mrope sections (temporal, height, width) sum to head_dim / 2
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [half - 2 * (half // 3), half // 3, half // 3]},
    )
    audio = dict(
        num_mel_bins=128,
        d_model=p["audio_dim"],
        encoder_layers=p["audio_layers"],
        encoder_attention_heads=2,
        encoder_ffn_dim=2 * p["audio_dim"],
        output_dim=p["hidden"],
        n_window=100,
        max_source_positions=1500,
    )
    vision = dict(
        depth=p["vision_depth"],
        hidden_size=p["vision_dim"],
        out_hidden_size=p["hidden"],
        intermediate_size=2 * p["vision_dim"],
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=56,
        fullatt_block_indexes=[p["vision_depth"] - 1],
    )
    return Qwen2_5OmniThinkerConfig(
        text_config=text,
        audio_config=audio,
        vision_config=vision,
        audio_token_index=ids("<|AUDIO|>"),
        image_token_index=ids("<|IMAGE|>"),
        video_token_index=ids("<|VIDEO|>"),
        audio_start_token_id=ids("<|audio_bos|>"),
        audio_end_token_id=ids("<|audio_eos|>"),
        vision_start_token_id=ids("<|vision_bos|>"),
        vision_end_token_id=ids("<|vision_eos|>"),
        pad_token_id=ids("<|endoftext|>"),
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
    )


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight thinker of ``preset`` (model, tokenizer, processors) into ``out``."""
    import torch
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration, WhisperFeatureExtractor
    from transformers.utils import logging as hf_logging

    from mm_pack_qwen2_5omni.data import CHAT_TEMPLATE
    from mm_pack_qwen2_5omni.processor import OmniProcessorWithoutVideo
    from mm_qwen_vision import image_processor

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    # processor_config.json (image processor + feature extractor), tokenizer, chat template
    OmniProcessorWithoutVideo(image_processor(), WhisperFeatureExtractor(feature_size=128), tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(out)
