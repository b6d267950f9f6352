"""Extract (optional): with the vision tower frozen, run it once and train from its outputs.

Features are the vision blocks' outputs *before* the merger (the projector), so the projector
still trains; the stage is the shared Qwen one (:mod:`mm_qwen_vision.extract`).
"""

from __future__ import annotations

from typing import Mapping

from mmcore import StageContext, StageResult, Manifest
from mm_qwen_vision.extract import extract_vision

from mm_pack_qwen2vl.family import FAMILY


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    return extract_vision(ctx, upstream, FAMILY)
