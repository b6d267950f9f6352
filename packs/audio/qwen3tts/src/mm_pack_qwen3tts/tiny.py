"""A tiny random Qwen3-TTS checkpoint in the public layout (same config.json field names, same
safetensors keys), for tests and ``model.source: init:tiny``. CustomVoice-shaped by default (one speaker in
``spk_id``); ``kind="base"`` adds the Base models' speaker encoder. Codebook ids are 0..31, the specials sit above them, and the
talker's codec vocabulary is 32 + 1024 so that the reference's "suppress the top 1024 ids but
eos" rule leaves exactly the codes and eos, as in the public 3072 = 2048 + 1024."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CODES = 32


def tiny_config(kind: str = "custom_voice") -> dict[str, Any]:
    """``kind``: ``custom_voice`` (a speaker in ``spk_id``) or ``base`` (a speaker encoder)."""
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "tiny",
        "tts_model_type": kind,
        "speaker_encoder_config": {
            "mel_dim": 16,
            "enc_dim": 32,
            "enc_channels": [16, 16, 16, 16, 48],  # mfa reads the SE-Res2Net outputs: 3 x 16
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 8,
            "enc_res2net_scale": 4,
            "enc_se_channels": 8,
            "sample_rate": 24000,
        },
        "im_start_token_id": 280,
        "im_end_token_id": 281,
        "tts_pad_token_id": 290,
        "tts_bos_token_id": 291,
        "tts_eos_token_id": 292,
        "talker_config": {
            "model_type": "qwen3_tts_talker",
            "vocab_size": CODES + 1024,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "hidden_act": "silu",
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "rope_scaling": {"mrope_section": [1, 1, 2], "interleaved": True, "rope_type": "default"},
            "attention_bias": False,
            "use_sliding_window": False,
            "num_code_groups": 4,
            "text_hidden_size": 24,
            "text_vocab_size": 300,
            "codec_pad_id": 40,
            "codec_bos_id": 41,
            "codec_eos_token_id": 42,
            "codec_think_id": 46,
            "codec_nothink_id": 47,
            "codec_think_bos_id": 48,
            "codec_think_eos_id": 49,
            "spk_id": {"tiny": 36},
            "spk_is_dialect": {"tiny": False},
            "codec_language_id": {"english": 34},
            "code_predictor_config": {
                "model_type": "qwen3_tts_talker_code_predictor",
                "vocab_size": CODES,
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 8,
                "max_position_embeddings": 64,
                "rope_theta": 10000.0,
                "num_code_groups": 4,
            },
        },
    }


def tiny_codec_config() -> dict[str, Any]:
    """``speech_tokenizer/config.json``: the public field names, a tiny decoder (4 codebooks of
    32, the public up-sampling 2 x 2 x 8 x 5 x 4 x 3 = 1920 samples per frame)."""
    return {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 4,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "encoder_config": {  # the public fields (transformers 4.57 MimiConfig.to_dict()), tiny widths
            "_frame_rate": 12.5,
            "sampling_rate": 24000,
            "audio_channels": 1,
            "num_filters": 4,
            "kernel_size": 7,
            "last_kernel_size": 3,
            "residual_kernel_size": 3,
            "num_residual_layers": 1,
            "dilation_growth_rate": 2,
            "compress": 2,
            "upsampling_ratios": [8, 6, 5, 4],
            "use_causal_conv": True,
            "pad_mode": "constant",
            "use_conv_shortcut": False,
            "trim_right_ratio": 1.0,
            "hidden_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "intermediate_size": 32,
            "hidden_act": "gelu",
            "norm_eps": 1e-5,
            "layer_scale_initial_scale": 0.01,
            "rope_theta": 10000.0,
            "max_position_embeddings": 512,
            "sliding_window": 8,
            "attention_bias": False,
            "num_quantizers": 6,  # more than encoder_valid_num_quantizers, as the public 32 vs 16
            "num_semantic_quantizers": 1,
            "codebook_size": CODES,
            "codebook_dim": 8,
            "vector_quantization_hidden_dimension": 8,
            "upsample_groups": 16,
        },
        "decoder_config": {
            "codebook_size": CODES,
            "codebook_dim": 16,
            "hidden_size": 16,
            "latent_dim": 16,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_quantizers": 4,
            "sliding_window": 4,
            "layer_scale_initial_scale": 0.01,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000,
            "max_position_embeddings": 256,
            "upsampling_ratios": [2, 2],
            "upsample_rates": [8, 5, 4, 3],
            "decoder_dim": 32,
        },
    }


CORPUS = [
    "zero one two three four five six seven eight nine ten.",
    "hello world, this is a tiny speech test.",
    "the quick brown fox jumps over the lazy dog.",
    "Qwen three speaks text as twelve hertz speech codes.",
] * 4


def write_tokenizer(out: Path) -> None:
    """A byte-level BPE Qwen2 tokenizer (the public checkpoints ship Qwen2's: vocab.json,
    merges.txt) of 279 tokens, then ``<|endoftext|>`` 279, ``<|im_start|>`` 280 and
    ``<|im_end|>`` 281, the ids :func:`tiny_config` names, and ``assistant`` 282."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=279, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, unk_token=None, bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens(["assistant"])  # one id (282), as in Qwen2's vocabulary: the role is 3 ids
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "assistant"])
    if ids != [279, 280, 281, 282]:
        raise RuntimeError(f"the tiny tokenizer's specials landed at {ids}, not 279-282")
    tok.save_pretrained(out)


def build_tiny_checkpoint(out: Path, seed: int = 0, kind: str = "custom_voice") -> Path:
    """Write ``config.json`` + ``model.safetensors`` and ``speech_tokenizer/{config.json,
    model.safetensors}`` (random weights, fp32; the codec's ``decoder.*`` and ``encoder.*``, the
    latter with the public transformers-4.57 Mimi names) into ``out``."""
    import torch
    from safetensors.torch import save_file

    from mm_pack_qwen3tts.model import Qwen3TTS

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(kind)
    torch.manual_seed(seed)
    model = Qwen3TTS(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) * (0.5 if "embedding" in name else 0.2))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    from mm_pack_qwen3tts.codec import SpeechTokenizer

    codec_dir = out / "speech_tokenizer"
    codec_dir.mkdir(exist_ok=True)
    codec = SpeechTokenizer(tiny_codec_config())
    with torch.no_grad():
        for name, param in codec.named_parameters():
            if name.endswith("cluster_usage"):
                param.copy_(1 + torch.rand_like(param))
            elif not name.endswith(("norm.weight", "scale", "gamma")):
                param.copy_(torch.randn_like(param) * 0.2)
    from mm_pack_qwen3tts.encoder import SpeechEncoder, to_public

    encoder = SpeechEncoder(tiny_codec_config())  # transformers' own (seeded) init: latents of std ~3
    with torch.no_grad():
        for name, tensor in encoder.state_dict().items():
            if name.endswith("cluster_usage"):
                tensor.copy_(1 + torch.rand_like(tensor))
            elif name.endswith("embed_sum"):  # codewords = embed_sum / cluster_usage, near the projected latents
                tensor.copy_(torch.randn_like(tensor) * 1.5)
            elif name.endswith("layer_scale.scale"):  # 0.01 at init would hide the attention and MLP
                tensor.copy_(0.5 + 0.5 * torch.rand_like(tensor))
    state = {k: v.contiguous() for k, v in codec.state_dict().items()}
    state.update({to_public(k): v.contiguous() for k, v in encoder.state_dict().items()})
    (codec_dir / "config.json").write_text(json.dumps(tiny_codec_config(), indent=2) + "\n", encoding="utf-8")
    save_file(state, str(codec_dir / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(out)
    return out


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """``model.source: init:tiny``, or ``init:demo`` (:mod:`mm_pack_qwen3tts.demo`: the tiny
    checkpoint with the demo's fitted encoder and code spectra)."""
    from mmcore import StageError

    if preset == "demo":
        from mm_pack_qwen3tts.demo import build_demo_checkpoint

        build_demo_checkpoint(Path(out), seed=seed)
    elif preset == "tiny":
        build_tiny_checkpoint(Path(out), seed=seed)
    else:
        raise StageError(f"init:{preset}: the qwen3tts pack builds init:tiny and init:demo")
