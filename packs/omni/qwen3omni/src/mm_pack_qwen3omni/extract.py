"""Extract (optional): run the frozen towers once and train from their outputs.

With ``audio`` in ``training.freeze`` the audio tower's outputs per clip are cached; with
``vision`` what the mergers take (the last block's output and each DeepStack block's,
:mod:`mm_qwen_vision.deepstack`), so the projector keeps training. The stage is the shared Qwen
one (:func:`mm_qwen_vision.extract.extract_vision`).
"""

from __future__ import annotations

from typing import Mapping

from mmcore import StageContext, StageResult, Manifest
from mm_qwen_vision.deepstack import deepstack_features
from mm_qwen_vision.extract import extract_vision

from mm_pack_qwen3omni.family import FAMILY


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    return extract_vision(ctx, upstream, FAMILY, deepstack_features, what="vision features (last block + DeepStack blocks)", audio=True)
