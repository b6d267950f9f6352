"""Tiny random-weight Whisper checkpoints built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder that ``from_pretrained`` and
``pipeline("automatic-speech-recognition")`` load: config, safetensors weights, a generation
config with Whisper's language/task tables, a small byte-level BPE tokenizer carrying Whisper's
special tokens in Whisper's order (language ids follow ``<|startoftranscript|>``), and the
feature extractor. The window is 2 s (`tiny`) or 1 s (`demo`) instead of 30 s, so a step takes
milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.engines import pick_preset

# Words the tiny tokenizer learns whole: the demo's vocabulary plus common English.
CORPUS = [
    "zero one two three four five six seven eight nine",
    "the quick brown fox jumps over the lazy dog and a cat is on the mat",
    "hello world yes no this is a test of speech recognition",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-",
]

PRESETS = {
    "tiny": {"d_model": 64, "layers": 2, "heads": 4, "ffn": 128, "seconds": 2},
    "demo": {"d_model": 96, "layers": 2, "heads": 4, "ffn": 192, "seconds": 1},
}
N_MELS = 80
MAX_TARGET_POSITIONS = 64


def special_tokens() -> list[str]:
    """Whisper's special tokens in the order its tokenizer and generate() assume."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return [
        "<|endoftext|>",
        "<|startoftranscript|>",
        *[f"<|{code}|>" for code in LANGUAGES],
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nocaptions|>",
        "<|notimestamps|>",
    ]


def build_tokenizer(vocab_size: int = 400):  # type: ignore[no-untyped-def]
    from transformers import WhisperTokenizer

    from mmcore.engines import train_byte_level_bpe

    vocab, merges = train_byte_level_bpe(CORPUS, vocab_size)
    tokenizer = WhisperTokenizer(vocab=vocab, merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": special_tokens()})
    return tokenizer


def generation_config(tokenizer, max_length: int):  # type: ignore[no-untyped-def]
    """What WhisperForConditionalGeneration.generate() reads to force language and task."""
    from transformers import GenerationConfig
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    ids = tokenizer.convert_tokens_to_ids
    return GenerationConfig(
        decoder_start_token_id=ids("<|startoftranscript|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        max_length=max_length,
        lang_to_id={f"<|{code}|>": ids(f"<|{code}|>") for code in LANGUAGES},
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
        no_timestamps_token_id=ids("<|notimestamps|>"),
        is_multilingual=True,
    )


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight checkpoint of ``preset`` (model, tokenizer, feature extractor) into ``out``."""
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
    from transformers.utils import logging as hf_logging

    p = pick_preset(PRESETS, preset)
    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    features = WhisperFeatureExtractor(feature_size=N_MELS, chunk_length=p["seconds"])
    ids = tokenizer.convert_tokens_to_ids
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=N_MELS,
        d_model=p["d_model"],
        encoder_layers=p["layers"],
        decoder_layers=p["layers"],
        encoder_attention_heads=p["heads"],
        decoder_attention_heads=p["heads"],
        encoder_ffn_dim=p["ffn"],
        decoder_ffn_dim=p["ffn"],
        max_source_positions=features.nb_max_frames // 2,  # the encoder's conv halves the frames
        max_target_positions=MAX_TARGET_POSITIONS,
        pad_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=ids("<|startoftranscript|>"),
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = generation_config(tokenizer, MAX_TARGET_POSITIONS)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    features.save_pretrained(out)
