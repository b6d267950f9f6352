"""The wan pack's config: the diffusion kit's sections, with Wan's VAE constraints on buckets."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.kits import FlowMatchingTraining, SampleExport, VideoData


class WanData(VideoData):
    """Buckets as Wan's VAE takes them: frames = 4k+1, sizes multiples of 16."""

    size_multiple, size_reason, frame_stride = 16, "VAE 8 x patch 2", 4


class WanConfig(RunConfig):
    data: WanData = Field(default_factory=WanData)
    training: FlowMatchingTraining = Field(default_factory=FlowMatchingTraining)  # Wan's flow_shift: 3-5
    export: SampleExport = Field(default_factory=SampleExport)
