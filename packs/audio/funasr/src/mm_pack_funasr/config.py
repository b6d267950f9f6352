"""The funasr pack's config: mmcore's sections with MLLM JSON data (``<audio>`` conversations)."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.data import MLLMDataSection


class FunAsrData(MLLMDataSection):
    """MLLM JSON / ShareGPT data with ``<audio>`` placeholders and ``audios`` lists."""


class FunAsrConfig(RunConfig):
    data: FunAsrData = Field(default_factory=FunAsrData)
