"""The opensoraplan pack's config: the diffusion kit's sections, with the VAE's bucket rules."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.kits import FlowMatchingTraining, SampleExport, VideoData


class OpenSoraPlanData(VideoData):
    """Buckets as the demo VAE takes them: frames = 4k+1, sizes multiples of 16 (Open-Sora Plan's
    own WF-VAE: 8k+1 frames, multiples of 16 too: 8x and the 2x2 patch)."""

    size_multiple, size_reason, frame_stride = 16, "VAE 8 x patch 2", 4


class OpenSoraPlanConfig(RunConfig):
    data: OpenSoraPlanData = Field(default_factory=OpenSoraPlanData)
    training: FlowMatchingTraining = Field(default_factory=FlowMatchingTraining)  # the reference's shift: 7 (inference), logit-normal levels
    export: SampleExport = Field(default_factory=SampleExport)
