"""The qwen2vl pack's config: mmcore's sections plus the Qwen vision options and the demo."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import MegatronConvertSection, MegatronExportSection, RunConfig
from mm_qwen_vision import QwenVisionData


class Qwen2VLData(QwenVisionData):
    """The Qwen vision data options; ``eval_datasets`` and ``demo_samples`` come with them (mmcore.data.mllm)."""


class Qwen2VLConfig(RunConfig):
    data: Qwen2VLData = Field(default_factory=Qwen2VLData)
    convert: MegatronConvertSection = Field(default_factory=MegatronConvertSection)  # convert.mindspeed_mm: import MindSpeed-MM weights
    export: MegatronExportSection = Field(default_factory=MegatronExportSection)  # export.format: mindspeed-mm
