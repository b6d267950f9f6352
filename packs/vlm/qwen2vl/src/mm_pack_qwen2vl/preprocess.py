"""Preprocess: MLLM JSON datasets -> tokenized, length-indexed shards (train and eval splits)."""

from __future__ import annotations

from typing import Mapping

from mmcore.context import StageContext
from mmcore.pack import StageResult
from mmcore.rundir import Manifest


def preprocess(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult:
    from transformers import AutoConfig, AutoTokenizer

    from mm_pack_qwen2vl.data import Encoder
    from mm_pack_qwen2vl.demo import write_demo_dataset
    from mmcore.data.conversations import preprocess_conversations

    model_dir = upstream["download"].output("model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    merge = AutoConfig.from_pretrained(model_dir).vision_config.spatial_merge_size
    ids = tokenizer.convert_tokens_to_ids
    return preprocess_conversations(
        ctx, Encoder(tokenizer, ctx.config.data, merge_size=merge), demo=write_demo_dataset,
        pad_id=tokenizer.pad_token_id, image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"), tokenizer=str(model_dir),
    )
