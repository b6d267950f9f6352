"""The qwen2.5omni pack's config: mmcore's sections plus the Qwen vision options and the demo."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mm_qwen_vision import QwenVisionData


class OmniData(QwenVisionData):
    """The Qwen vision data options; ``eval_datasets`` and ``demo_samples`` come with them (mmcore.data.mllm)."""


class OmniConfig(RunConfig):
    data: OmniData = Field(default_factory=OmniData)
