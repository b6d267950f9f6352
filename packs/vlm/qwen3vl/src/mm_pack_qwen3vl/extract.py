"""Extract (optional): with the vision tower frozen, run it once and train from its outputs.

Features are what the mergers (the projector, which still trains) take: the last block's
output and, concatenated after it on the feature axis, the output of each DeepStack block
(``deepstack_visual_indexes``); the stage is the shared Qwen one (:mod:`mm_qwen_vision.extract`).
"""

from __future__ import annotations

from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.pack import StageResult
from mmcore.rundir import Manifest
from mm_qwen_vision.extract import extract_vision

from mm_pack_qwen3vl.family import FAMILY


def vision_features(visual: Any, pixels: Any, grid: Any) -> Any:
    """[patches, hidden x (1 + DeepStack blocks)]: the last block's output, then each DeepStack block's."""
    import torch

    taken: list[Any] = []
    hooks = [visual.blocks[i].register_forward_hook(lambda module, args, out: taken.append(out)) for i in visual.deepstack_visual_indexes]
    try:
        last = visual(pixels.to(visual.dtype), grid_thw=grid).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([last, *taken], dim=-1)


def extract(ctx: StageContext, upstream: Mapping[str, Manifest]) -> StageResult | None:
    return extract_vision(ctx, upstream, FAMILY, vision_features, what="vision features (last block + DeepStack blocks)")
