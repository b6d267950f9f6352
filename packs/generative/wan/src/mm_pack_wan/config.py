"""The wan pack's config: mmcore's sections plus video sampling, flow matching and samples."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mmcore.config import DataSection, ExportSection, RunConfig, TrainingSection


class WanData(DataSection):
    fps: float = Field(8.0, gt=0, description="Frames per second sampled from each video.")
    buckets: list[tuple[int, int, int]] = Field(default_factory=lambda: [(32, 32, 9)], description="(height, width, frames) buckets; frames = 4k+1, sizes multiples of 16.")
    max_sequence_length: int = Field(32, ge=4, description="Text tokens per caption (UMT5).")
    demo_samples: int = Field(0, ge=0, description="Generate the synthetic moving-squares dataset with this many clips (the demo).")

    @field_validator("buckets")
    @classmethod
    def _valid(cls, buckets: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        for h, w, f in buckets:
            if h % 16 or w % 16:
                raise ValueError(f"bucket {h}x{w}: height and width must be multiples of 16 (VAE 8 x patch 2)")
            if (f - 1) % 4:
                raise ValueError(f"bucket frames {f}: must be 4k+1 (the VAE compresses time by 4)")
        return buckets


class WanTraining(TrainingSection):
    caption_dropout: float = Field(0.1, ge=0, le=1, description="Probability of training on the empty caption (for classifier-free guidance).")
    flow_shift: float = Field(3.0, gt=0, description="Timestep shift of the flow-matching schedule (Wan uses 3-5).")
    timestep_sampling: Literal["uniform", "logit_normal"] = "logit_normal"


class WanExport(ExportSection):
    sample_prompts: list[str] = Field(default_factory=list, description="Captions to generate sample videos for after export.")
    sample_steps: int = Field(20, ge=1)
    guidance_scale: float = Field(4.0, ge=1.0)


class WanConfig(RunConfig):
    data: WanData = Field(default_factory=WanData)
    training: WanTraining = Field(default_factory=WanTraining)
    export: WanExport = Field(default_factory=WanExport)
