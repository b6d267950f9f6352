"""Tiny random-weight Fun-ASR-Nano models built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder that
``FunAsrNanoForConditionalGeneration.from_pretrained`` loads: config, safetensors weights, a
small byte-level BPE tokenizer with the Qwen special tokens (``<|object_ref_start|>`` is the
audio placeholder), and ``FunAsrNanoProcessor``'s files (the feature extractor's settings, the
checkpoint's chat template) as transformers' conversion script saves them.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>"]

# Words the tiny tokenizer learns whole: the template's text, the demo's digits, chat text.
CORPUS = [
    "You are a helpful assistant. system user assistant",
    "语音转写：语音转写成英文：请结合上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。**上下文信息：** 热词列表：",
    "zero one two three four five six seven eight nine",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "audio_dim": 32, "audio_layers": 2, "adaptor_layers": 1},
    "demo": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "audio_dim": 96, "audio_layers": 3, "adaptor_layers": 1},
}


def build_tokenizer(vocab_size: int = 400):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Tokenizer

    from mmcore.engines import train_byte_level_bpe

    vocab, merges = train_byte_level_bpe(CORPUS, vocab_size)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens(["<|endoftext|>"], special_tokens=True)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    from transformers import FunAsrNanoConfig

    p = pick_preset(PRESETS, preset)
    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=p["hidden"] // p["heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=ids("<|endoftext|>"),
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
    )
    audio = dict(
        num_mel_bins=80,
        hidden_size=p["audio_dim"],
        num_attention_heads=2,
        intermediate_size=2 * p["audio_dim"],
        num_hidden_layers=p["audio_layers"],
        num_timestamp_prediction_layers=1,
        max_position_embeddings=2049,
        hidden_dropout=0.0,  # the released config's 0.1 draws from the global RNG per rank: off, so runs compare exactly
        attention_dropout=0.0,
    )
    adaptor = dict(
        hidden_size=p["hidden"],
        intermediate_size=p["hidden"] // 4,
        num_attention_heads=2,
        num_hidden_layers=p["adaptor_layers"],
        projector_hidden_size=2 * p["hidden"],
    )
    return FunAsrNanoConfig(text_config=text, audio_config=audio, adaptor_config=adaptor, audio_token_id=ids("<|object_ref_start|>"), tie_word_embeddings=True)


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight Fun-ASR-Nano of ``preset`` (model, tokenizer, processor) into ``out``."""
    import torch
    from transformers import FunAsrNanoForConditionalGeneration, FunAsrNanoProcessor
    from transformers.utils import logging as hf_logging

    from mm_pack_funasr.data import CHAT_TEMPLATE
    from mm_pack_funasr.features import family_feature_extractor

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = FunAsrNanoForConditionalGeneration(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    FunAsrNanoProcessor(family_feature_extractor(), tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(out)
