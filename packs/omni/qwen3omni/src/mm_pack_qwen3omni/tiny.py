"""Tiny random-weight Qwen3-Omni thinkers built from config: how tests and the demo run offline.

``init:tiny`` and ``init:demo`` write a folder that
``Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained`` loads: config (a MoE text model
of 4 experts, 2 per token, as the released 30B-A3B is one of 128), safetensors weights with one
tensor per expert (what ``save_pretrained`` writes), the tiny Qwen tokenizer with the Omni
tokens named as attributes (the processor reads ``tokenizer.audio_token`` and friends), the
image processor, the 128-mel feature extractor and the chat template.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.data import SHAPE_TONE_QUESTION
from mmcore.engines import pick_preset

AUDIO_TOKENS = ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>")
NAMED_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
# The image-plus-tone demo's words, learned whole.
CORPUS = (SHAPE_TONE_QUESTION.replace("<image><audio>", ""), "red green blue yellow low middle high sound tone audio hear")

PRESETS = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 32, "audio_dim": 32, "audio_layers": 2},
    "demo": {"hidden": 96, "layers": 2, "heads": 4, "kv_heads": 2, "vision_depth": 2, "vision_dim": 48, "audio_dim": 48, "audio_layers": 2},
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    from mm_qwen_vision.tiny import build_tokenizer as qwen_tokenizer

    return qwen_tokenizer(400, corpus=CORPUS, special_tokens=AUDIO_TOKENS, named=NAMED_TOKENS)


def model_config(preset: str, tokenizer):  # type: ignore[no-untyped-def]
    """The thinker config of a tiny preset, its token ids taken from ``tokenizer``."""
    from transformers import Qwen3OmniMoeThinkerConfig

    p = pick_preset(PRESETS, preset)
    ids = tokenizer.convert_tokens_to_ids
    head_dim = p["hidden"] // p["heads"]
    half = head_dim // 2  # interleaved mrope sections (temporal, height, width) sum to head_dim / 2
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        intermediate_size=2 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [half - 2 * (half // 4), half // 4, half // 4], "mrope_interleaved": True},
        # 2 x moe_intermediate_size != hidden_size, so the fused-expert layouts stay apart (mmcore.engines.convert.FusedExpertsAdapter)
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=p["hidden"] // 4 * 3,
        decoder_sparse_step=1,
        router_aux_loss_coef=0.001,
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    # Windows of 100 mel frames (1 s) become 13 tokens each, as the released tower's.
    audio = dict(
        num_mel_bins=128,
        d_model=p["audio_dim"],
        encoder_layers=p["audio_layers"],
        encoder_attention_heads=2,
        encoder_ffn_dim=2 * p["audio_dim"],
        output_dim=p["hidden"],
        n_window=50,
        n_window_infer=800,
        downsample_hidden_size=16,
        max_source_positions=1500,
    )
    # 8 x 8 learned positions (resampled per image); DeepStack: the first block's features feed decoder layer 0
    vision = dict(
        depth=p["vision_depth"],
        hidden_size=p["vision_dim"],
        intermediate_size=2 * p["vision_dim"],
        num_heads=2,
        out_hidden_size=p["hidden"],
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=64,
        deepstack_visual_indexes=[0],
    )
    return Qwen3OmniMoeThinkerConfig(
        text_config=text,
        audio_config=audio,
        vision_config=vision,
        position_id_per_seconds=13,
        audio_token_id=ids("<|audio_pad|>"),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        audio_start_token_id=ids("<|audio_start|>"),
        audio_end_token_id=ids("<|audio_end|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """Write a random-weight thinker of ``preset`` (model, tokenizer, processors) into ``out``."""
    import torch
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration, WhisperFeatureExtractor
    from transformers.utils import logging as hf_logging

    from mm_pack_qwen3omni.data import CHAT_TEMPLATE, MEAN_STD
    from mm_pack_qwen3omni.processor import OmniProcessorWithoutVideo
    from mm_qwen_vision import image_processor

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    config = model_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = Qwen3OmniMoeThinkerForConditionalGeneration(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    # processor_config.json (image processor + feature extractor), tokenizer, chat template
    OmniProcessorWithoutVideo(image_processor(patch_size=16, mean_std=MEAN_STD), WhisperFeatureExtractor(feature_size=128), tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(out)
