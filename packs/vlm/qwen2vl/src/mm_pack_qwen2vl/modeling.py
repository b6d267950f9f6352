"""The Qwen2-VL model itself: built from a config folder, loaded from a converted checkpoint,
and switched to cached vision features. Every stage module imports it; it imports none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.train import load_converted


def model_class(config: Any) -> Any:
    if config.model_type == "qwen2_5_vl":
        from transformers import Qwen2_5_VLForConditionalGeneration

        return Qwen2_5_VLForConditionalGeneration
    from transformers import Qwen2VLForConditionalGeneration

    return Qwen2VLForConditionalGeneration


def build_model(model_dir: Path, checkpoint: Path | None = None) -> Any:
    """The model of ``model_dir``'s config, weights from a DCP ``checkpoint`` (convert's or train's)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = "sdpa"
    model = model_class(config)(config)
    if checkpoint is not None:
        load_converted(model, checkpoint)
    return model


def use_cached_vision(model: Any) -> Any:
    """Make the vision tower take cached block outputs and apply only the merger (projector)."""
    from mm_qwen_vision import use_cached_vision as merger_only

    merger_only(model.model.visual)
    return model
