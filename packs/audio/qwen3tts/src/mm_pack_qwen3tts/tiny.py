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


def build_tiny_checkpoint(out: Path, seed: int = 0, kind: str = "custom_voice") -> Path:
    """Write ``config.json`` + ``model.safetensors`` and ``speech_tokenizer/{config.json,
    model.safetensors}`` (random weights, fp32; the codec's ``decoder.*`` only) into ``out``."""
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
    (codec_dir / "config.json").write_text(json.dumps(tiny_codec_config(), indent=2) + "\n", encoding="utf-8")
    save_file({k: v.contiguous() for k, v in codec.state_dict().items()}, str(codec_dir / "model.safetensors"), metadata={"format": "pt"})
    return out


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """``model.source: init:tiny``."""
    from mmcore import StageError

    if preset != "tiny":
        raise StageError(f"init:{preset}: the qwen3tts pack builds only init:tiny")
    build_tiny_checkpoint(Path(out), seed=seed)
