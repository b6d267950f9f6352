"""Extract (optional): with the vision tower frozen, run it once and train from its outputs.

Features are what the mergers (the projector, which still trains) take: the last block's
output and, concatenated after it on the feature axis, the output of each DeepStack block
(:mod:`mm_qwen_vision.deepstack`); the stage is the shared Qwen one (:mod:`mm_qwen_vision.extract`).
"""

from __future__ import annotations

from typing import Mapping

from mmcore import StageContext, StageResult, Manifest
from mm_qwen_vision.deepstack import deepstack_features
from mm_qwen_vision.extract import extract_vision

from mm_pack_qwen3vl.family import FAMILY


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    return extract_vision(ctx, upstream, FAMILY, deepstack_features, what="vision features (last block + DeepStack blocks)")
