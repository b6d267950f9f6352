"""The whisper pack's config: mmcore's sections plus transcript fields, language/task and SpecAugment."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmcore.config import RunConfig, Section, TrainingSection
from mmcore.data import MLLMDataSection


class TranscriptFields(Section):
    """Field names of a transcript record; ``auto`` tries the names common datasets use."""

    audio: str = Field("auto", description="auto: audio, audio_filepath (NeMo), path, file.")
    text: str = Field("auto", description="auto: text, sentence (Common Voice), transcript, transcription.")
    language: str = Field("language", description="Optional per-sample language (code or name).")


class WhisperData(MLLMDataSection):
    fields: TranscriptFields = Field(default_factory=TranscriptFields)
    language: str | None = Field("en", description="Language of samples that name none; null: no language token.")
    task: Literal["transcribe", "translate"] = Field("transcribe", description="Whisper's task token.")
    eval_datasets: list[str] = Field(default_factory=list, description="Held-out transcript datasets for WER.")
    demo_samples: int = Field(0, ge=0, description="Without data.datasets, generate a synthetic spoken-digits dataset of this many clips (the demo; ignored when datasets are given).")


class WhisperTraining(TrainingSection):
    spec_augment: bool = Field(False, description="Mask time steps and mel channels of the input features while training.")
    mask_time_prob: float = Field(0.05, ge=0, lt=1, description="SpecAugment: fraction of time steps masked.")
    mask_time_length: int = Field(10, ge=1, description="SpecAugment: frames per time mask.")
    mask_feature_prob: float = Field(0.0, ge=0, lt=1, description="SpecAugment: fraction of mel channels masked.")
    mask_feature_length: int = Field(10, ge=1, description="SpecAugment: channels per feature mask.")


class WhisperConfig(RunConfig):
    data: WhisperData = Field(default_factory=WhisperData)
    training: WhisperTraining = Field(default_factory=WhisperTraining)
