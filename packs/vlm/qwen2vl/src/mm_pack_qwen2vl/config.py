"""The qwen2vl pack's config: mmcore's sections plus Qwen2-VL's media and demo options."""

from __future__ import annotations

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.data.mllm import MLLMDataSection


class Qwen2VLData(MLLMDataSection):
    image_min_pixels: int = Field(56 * 56, ge=28 * 28, description="Images smaller than this are upscaled.")
    image_max_pixels: int = Field(512 * 28 * 28, ge=28 * 28, description="Images larger than this are downscaled.")
    video_fps: float = Field(2.0, gt=0, description="Frames sampled per second of video.")
    video_max_frames: int = Field(16, ge=2, description="At most this many frames per video (even: 2 frames per temporal patch).")
    video_max_pixels: int = Field(128 * 28 * 28, ge=28 * 28, description="Pixel budget of each video frame.")
    eval_datasets: list[str] = Field(default_factory=list, description="Held-out datasets (MLLM JSON) for evaluation.")
    demo_samples: int = Field(0, ge=0, description="Generate a synthetic shapes-and-colours dataset of this many samples (the demo).")


class Qwen2VLConfig(RunConfig):
    data: Qwen2VLData = Field(default_factory=Qwen2VLData)
