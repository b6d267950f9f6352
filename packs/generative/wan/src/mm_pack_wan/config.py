"""The wan pack's config: the diffusion kit's sections, with Wan's VAE constraints on buckets."""

from __future__ import annotations

from pydantic import Field, field_validator

from mmcore.config import RunConfig
from mmcore.kits.diffusion import FlowMatchingTraining, SampleExport, VideoData


class WanData(VideoData):
    """Buckets as Wan's VAE takes them: frames = 4k+1, sizes multiples of 16."""

    @field_validator("buckets")
    @classmethod
    def _valid(cls, buckets: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        for h, w, f in buckets:
            if h % 16 or w % 16:
                raise ValueError(f"bucket {h}x{w}: height and width must be multiples of 16 (VAE 8 x patch 2)")
            if (f - 1) % 4:
                raise ValueError(f"bucket frames {f}: must be 4k+1 (the VAE compresses time by 4)")
        return buckets


class WanConfig(RunConfig):
    data: WanData = Field(default_factory=WanData)
    training: FlowMatchingTraining = Field(default_factory=FlowMatchingTraining)  # Wan's flow_shift: 3-5
    export: SampleExport = Field(default_factory=SampleExport)
