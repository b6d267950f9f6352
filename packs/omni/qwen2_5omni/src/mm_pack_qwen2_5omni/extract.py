"""Extract (optional): run the frozen towers once and train from their outputs.

With ``audio`` in ``training.freeze`` the audio tower's outputs per clip are cached (the whole
tower is frozen); with ``vision`` the vision blocks' outputs per image/video *before* the
merger (the projector keeps training). The stage is the shared Qwen one
(:func:`mm_qwen_vision.extract.extract_vision`).
"""

from __future__ import annotations

from typing import Mapping

from mmcore import StageContext, StageResult, Manifest
from mm_qwen_vision.extract import extract_vision

from mm_pack_qwen2_5omni.family import FAMILY


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    return extract_vision(ctx, upstream, FAMILY, audio=True)
