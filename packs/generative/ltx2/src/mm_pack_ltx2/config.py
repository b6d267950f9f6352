"""The ltx2 pack's config: the diffusion kit's sections, with LTX-2's bucket rules and its sound."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.kits import FlowMatchingTraining, SampleExport, VideoData


class LTX2Data(VideoData):
    """Buckets as ``LTX2Pipeline`` takes them: sides multiples of 32 (its own check), frames
    4k+1 (the tiny VAE's temporal compression; the released VAE's is 8: 8k+1). Each clip keeps
    its sound track, mono at 16 kHz (the audio VAE's rate)."""

    size_multiple, size_reason, frame_stride = 32, "LTX2Pipeline requires multiples of 32", 4

    audio_rate: int | None = Field(16000, gt=0, description="The clips' sound track is kept at this rate (mono) beside the frames; the audio VAE's sample_rate (16 kHz).")


class LTX2Config(RunConfig):
    data: LTX2Data = Field(default_factory=LTX2Data)
    training: FlowMatchingTraining = Field(default_factory=FlowMatchingTraining)
    export: SampleExport = Field(default_factory=SampleExport)
