"""The qwen3tts pack's run config: mmcore's sections, with speech records for data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmcore.config import RunConfig, Section
from mmcore.data import MLLMDataSection


class Qwen3TTSData(MLLMDataSection):
    """``{"audio": ..., "text": ..., "speaker"?: ..., "language"?: ...}`` records (JSON or JSONL)."""

    speaker: str | None = Field(None, description="CustomVoice speaker (a name of the checkpoint's spk_id) of records that name none; null: no speaker slot.")
    language: str | None = Field(None, description="Language (a name of codec_language_id) of records that name none; null: the reference's 'auto'.")


class Qwen3TTSSpeech(Section):
    vocoder: Literal["codec", "griffin_lim"] = Field(
        "codec",
        description="What turns codes into a waveform: the speech tokenizer's decoder, or Griffin-Lim over the demo codec's code spectra (speech_tokenizer/demo/spectra.safetensors, written by init:demo; no learned weights).",
    )


class Qwen3TTSConfig(RunConfig):
    data: Qwen3TTSData = Field(default_factory=Qwen3TTSData)
    speech: Qwen3TTSSpeech = Field(default_factory=Qwen3TTSSpeech)
