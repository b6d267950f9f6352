"""Preprocess: MLLM JSON with images, videos and audio -> tokenized, length-indexed shards."""

from __future__ import annotations

from typing import Mapping

from mmcore.context import StageContext
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from transformers import AutoTokenizer, Qwen2_5OmniThinkerConfig, WhisperFeatureExtractor

    from mm_pack_qwen2_5omni.data import Encoder
    from mm_pack_qwen2_5omni.demo import write_demo_dataset
    from mmcore.data.conversations import preprocess_conversations

    model_dir = upstream["download"].output("model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    merge = Qwen2_5OmniThinkerConfig.from_pretrained(model_dir).vision_config.spatial_merge_size
    encoder = Encoder(tokenizer, WhisperFeatureExtractor.from_pretrained(model_dir), ctx.config.data, merge_size=merge)
    ids = tokenizer.convert_tokens_to_ids
    return preprocess_conversations(
        ctx, encoder, demo=write_demo_dataset,
        pad_id=tokenizer.pad_token_id, image_token_id=ids("<|IMAGE|>"), video_token_id=ids("<|VIDEO|>"), audio_token_id=ids("<|AUDIO|>"),
    )
