"""The stepvideo pack's config: the diffusion kit's sections, with the VAE's bucket rules."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.kits import FlowMatchingTraining, SampleExport, VideoData


class StepVideoData(VideoData):
    """Buckets as the demo VAE takes them: frames = 4k+1, sizes multiples of 8 (its 4x and the tiny models' 2x2 patch;
    Step-Video's own VAE: 16x, frames in 17s)."""

    size_multiple, size_reason, frame_stride = 8, "demo VAE 4x x patch 2", 4


class StepVideoConfig(RunConfig):
    data: StepVideoData = Field(default_factory=StepVideoData)
    training: FlowMatchingTraining = Field(default_factory=FlowMatchingTraining)
    export: SampleExport = Field(default_factory=SampleExport)
