"""DeepStack in the frozen-vision cache (Qwen3-VL, Qwen3-Omni): the vision tower hands the
features of some of its blocks (``deepstack_visual_indexes``), each through its own merger, to
the first decoder layers, so the cache holds those blocks' outputs beside the last block's and
the mergers (the projector) still train.
"""

from __future__ import annotations

from typing import Any


def deepstack_features(visual: Any, pixels: Any, grid: Any) -> Any:
    """An :func:`~mm_qwen_vision.extract.extract_vision` ``features``: [patches, hidden x (1 +
    DeepStack blocks)], the last block's output, then each DeepStack block's."""
    import torch

    taken: list[Any] = []
    hooks = [visual.blocks[i].register_forward_hook(lambda module, args, out: taken.append(out)) for i in visual.deepstack_visual_indexes]
    try:
        last = visual(pixels.to(visual.dtype), grid_thw=grid).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([last, *taken], dim=-1)


def use_cached_deepstack_vision(visual: Any) -> Any:
    """Make the vision tower take :func:`deepstack_features` and apply only its mergers."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

    def mergers_only(hidden_states: Any, grid_thw: Any, **kwargs: Any) -> Any:
        last, *deepstack = (part.contiguous() for part in hidden_states.split(visual.config.hidden_size, dim=-1))
        return BaseModelOutputWithDeepstackFeatures(
            last_hidden_state=last, pooler_output=visual.merger(last), deepstack_features=[merger(h) for merger, h in zip(visual.deepstack_merger_list, deepstack)]
        )

    visual.forward = mergers_only
    return visual
