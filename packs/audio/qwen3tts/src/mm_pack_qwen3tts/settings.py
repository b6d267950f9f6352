"""The qwen3tts pack's run config: mmcore's sections, with speech records for data."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.data import MLLMDataSection


class Qwen3TTSData(MLLMDataSection):
    """``{"audio": ..., "text": ..., "speaker"?: ..., "language"?: ...}`` records (JSON or JSONL)."""

    speaker: str | None = Field(None, description="CustomVoice speaker (a name of the checkpoint's spk_id) of records that name none; null: no speaker slot.")
    language: str | None = Field(None, description="Language (a name of codec_language_id) of records that name none; null: the reference's 'auto'.")


class Qwen3TTSConfig(RunConfig):
    data: Qwen3TTSData = Field(default_factory=Qwen3TTSData)
