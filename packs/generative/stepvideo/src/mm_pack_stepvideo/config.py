"""The stepvideo pack's config: the diffusion kit's sections, with the VAE's bucket rules."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.kits import FlowMatchingTraining, SampleExport, VideoData


class StepVideoData(VideoData):
    """Sides multiples of 8 (the demo VAE's 4x and the tiny models' 2x2 patch). Frames are not
    ruled here: the VAE in the model folder decides them, and extract checks them against it
    (a diffusers VAE's 4k + 1; Step-Video's own VAE's 17k, its 204-frame clips among them, which
    no stride k + 1 rule admits) and its side (Step-Video's VAE: 16x, so 32 with the 2x2 patch)."""

    size_multiple, size_reason, frame_stride = 8, "demo VAE 4x x patch 2", 1


class StepVideoConfig(RunConfig):
    data: StepVideoData = Field(default_factory=StepVideoData)
    training: FlowMatchingTraining = Field(default_factory=FlowMatchingTraining)
    export: SampleExport = Field(default_factory=SampleExport)
