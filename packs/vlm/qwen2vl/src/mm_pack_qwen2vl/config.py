"""The qwen2vl pack's config: mmcore's sections plus the Qwen vision options and the demo."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.data.qwen_vision import QwenVisionData


class Qwen2VLData(QwenVisionData):
    eval_datasets: list[str] = Field(default_factory=list, description="Held-out datasets (MLLM JSON) for evaluation.")
    demo_samples: int = Field(0, ge=0, description="Generate a synthetic shapes-and-colours dataset of this many samples (the demo).")


class Qwen2VLConfig(RunConfig):
    data: Qwen2VLData = Field(default_factory=Qwen2VLData)
