"""The Qwen2.5-Omni thinker itself: built from a config folder, loaded from a converted
checkpoint, and switched to cached tower outputs. Every stage module imports it; it imports none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.train import load_converted


def build_model(model_dir: Path, checkpoint: Path | None = None) -> Any:
    """The thinker of ``model_dir``'s config, weights from a DCP ``checkpoint`` (convert's or train's).

    A full Omni folder's config nests the thinker's; ``Qwen2_5OmniThinkerConfig`` reads either.
    """
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    config = Qwen2_5OmniThinkerConfig.from_pretrained(model_dir)
    config._attn_implementation = "sdpa"
    model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    if checkpoint is not None:
        load_converted(model, checkpoint)
    return model


def use_cached_towers(model: Any, towers: list[str]) -> Any:
    """Make the frozen towers pass cached outputs through (the vision merger still runs)."""
    from transformers.modeling_outputs import BaseModelOutput

    from mm_qwen_vision import use_cached_vision

    inner = model.model
    if "audio" in towers:
        inner.get_audio_features = lambda input_features, *args, **kwargs: BaseModelOutput(last_hidden_state=input_features)
    if "vision" in towers:
        use_cached_vision(inner.visual)
    return model
