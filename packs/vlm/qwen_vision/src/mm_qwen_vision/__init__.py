"""The Qwen vision tower's input side, shared by the Qwen2-VL, Qwen2.5-VL and Qwen2.5-Omni packs.

Images go through transformers' own PIL image processor (no torchvision); video frames are
sampled with PyAV, go through the same processor and are paired into temporal patches. The
placeholder of an image or video becomes ``<start> <pad> * (patches / merge**2) <end>``; the
start/pad/end token names differ per family and are given by the pack.

Also here: the frozen-tower cache helpers (content keys per item, the merger-only forward).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from mmcore.data.chatml import Piece
from mmcore.data.mllm import MLLMDataSection
from mmcore.data.media import MediaError
from mmcore.data.video import load_image

__all__ = ["QwenVisionData", "image_processor", "load_video_frames", "video_patches", "QwenVisionExpanders", "split_items", "media_key", "use_cached_vision", "packed_mrope_positions"]


class QwenVisionData(MLLMDataSection):
    """MLLM JSON options plus the Qwen vision tower's pixel budgets and video sampling."""

    image_min_pixels: int = Field(56 * 56, ge=28 * 28, description="Images smaller than this are upscaled.")
    image_max_pixels: int = Field(512 * 28 * 28, ge=28 * 28, description="Images larger than this are downscaled.")
    video_fps: float = Field(2.0, gt=0, description="Frames sampled per second of video.")
    video_max_frames: int = Field(16, ge=2, description="At most this many frames per video (even: 2 frames per temporal patch).")
    video_max_pixels: int = Field(128 * 28 * 28, ge=28 * 28, description="Pixel budget of each video frame.")


def image_processor(min_pixels: int = 56 * 56, max_pixels: int = 512 * 28 * 28):  # type: ignore[no-untyped-def]
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    except ImportError:
        from mmcore.errors import missing_dependency

        raise missing_dependency("transformers", "the Qwen image processor") from None

    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)


def load_video_frames(path: Path, fps: float, max_frames: int) -> list[Any]:
    """Frames sampled at ``fps`` (at most ``max_frames``, an even count) as PIL images, via PyAV."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            frames = [frame.to_image() for frame in container.decode(stream)]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
    except (av.error.FFmpegError, IndexError, OSError, ValueError) as exc:
        raise MediaError(f"unreadable video {path}: {exc}") from None
    if len(frames) < 2:
        raise MediaError(f"video {path} has {len(frames)} frame(s); at least 2 are needed")
    step = max(rate / fps, 1.0)
    picked = [frames[min(int(i * step), len(frames) - 1)] for i in range(max(2, int(len(frames) / step)))]
    picked = picked[: max_frames - max_frames % 2]
    if len(picked) % 2:
        picked.append(picked[-1])  # two frames per temporal patch
    return [f.convert("RGB") for f in picked]


def video_patches(frames: list[Any], processor: Any) -> tuple[Any, list[int]]:
    """Video patches: each frame through the image processor, frames paired in time."""
    import numpy as np

    out = processor(images=frames, return_tensors="np")
    grids = out["image_grid_thw"]
    if len({tuple(g) for g in grids.tolist()}) != 1:
        raise MediaError("video frames differ in size")
    _, gh, gw = grids[0].tolist()
    per_frame = out["pixel_values"].reshape(len(frames), gh * gw, 3, 2, processor.patch_size, processor.patch_size)[:, :, :, 0]
    pairs = per_frame.reshape(len(frames) // 2, 2, gh * gw, 3, processor.patch_size, processor.patch_size)
    patches = np.transpose(pairs, (0, 2, 3, 1, 4, 5)).reshape(len(frames) // 2 * gh * gw, -1)
    return np.ascontiguousarray(patches), [len(frames) // 2, gh, gw]


@dataclass
class QwenVisionExpanders:
    """``<image>`` and ``<video>`` expanders for :class:`~mmcore.data.chat_template.ChatTemplateEncoder`.

    Args:
        data_cfg: the pack's data section (``image_min_pixels``, ``image_max_pixels``,
            ``video_fps``, ``video_max_frames``, ``video_max_pixels``).
        merge: the tower's spatial merge size (tokens = patches / merge**2).
        image_tokens / video_tokens: (start, pad, end) token ids.
        seconds_per_grid: also store ``video_second_per_grid`` (Qwen2.5 families' time axis).
    """

    data_cfg: Any
    merge: int
    image_tokens: tuple[int, int, int]
    video_tokens: tuple[int, int, int]
    seconds_per_grid: bool = False

    def __post_init__(self) -> None:
        cfg = self.data_cfg
        self.images = image_processor(cfg.image_min_pixels, cfg.image_max_pixels)
        self.frames = image_processor(min(cfg.image_min_pixels, cfg.video_max_pixels), cfg.video_max_pixels)

    def _tokens(self, grid: list[int], tokens: tuple[int, int, int]) -> list[int]:
        start, pad, end = tokens
        return [start, *[pad] * (grid[0] * grid[1] * grid[2] // self.merge**2), end]

    def image(self, path: Path) -> Piece:
        out = self.images(images=[load_image(path)], return_tensors="np")
        grid = out["image_grid_thw"][0].tolist()
        return Piece(self._tokens(grid, self.image_tokens), {"pixel_values": out["pixel_values"], "image_grid_thw": [grid]})

    def video(self, path: Path) -> Piece:
        frames = load_video_frames(path, self.data_cfg.video_fps, self.data_cfg.video_max_frames)
        patches, grid = video_patches(frames, self.frames)
        fields: dict[str, Any] = {"pixel_values_videos": patches, "video_grid_thw": [grid]}
        if self.seconds_per_grid:
            fields["video_second_per_grid"] = [self.frames.temporal_patch_size / self.data_cfg.video_fps]
        return Piece(self._tokens(grid, self.video_tokens), fields)


def split_items(pixels: Any, grids: Any) -> list[tuple[Any, Any]]:
    """One (pixels, grid[1, 3]) pair per image or video of a sample."""
    out, start = [], 0
    for grid in grids:
        n = int(grid.prod())
        out.append((pixels[start : start + n], grid[None]))
        start += n
    return out


def media_key(pixels: Any, grid: Any) -> str:
    """Content key of one image or video's patches (identical media are encoded once)."""
    digest = hashlib.sha256()
    digest.update(grid.numpy().tobytes())
    digest.update(pixels.contiguous().numpy().tobytes())
    return digest.hexdigest()


def use_cached_vision(visual: Any) -> Any:
    """Make a Qwen vision tower take cached block outputs and apply only its merger (projector)."""
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def merger_only(hidden_states: Any, grid_thw: Any, **kwargs: Any) -> Any:
        merged = visual.merger(hidden_states)
        if hasattr(visual, "get_window_index"):  # Qwen2.5 towers keep block outputs in window order
            window_index, _ = visual.get_window_index(grid_thw)
            merged = merged[torch.argsort(window_index)]
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=merged)

    visual.forward = merger_only
    return visual


def packed_mrope_positions(batch: dict[str, Any], counts: dict[str, str], rope_index: Any, follows: dict[str, str] | None = None) -> Any:
    """M-RoPE positions of a packed row, restarted per sample, with 1-D text positions first
    ([4, 1, total]): transformers reads the restarts in the text positions to keep the samples'
    attention apart.

    Args:
        batch: a packed batch (``segments`` and, per ``counts`` key, each sample's row count).
        counts: batch count key -> the field whose rows they count (``{"segment_images": "image_grid_thw"}``).
        rope_index: ``(token slice, {field: this sample's rows}) -> [3, 1, n]`` positions (the
            model's own ``get_rope_index``); not called for samples without media.
    """
    import torch

    ids = batch["input_ids"]
    at = dict.fromkeys(counts.values(), 0)
    parts, start = [], 0
    for i, length in enumerate(batch["segments"].tolist()):
        tokens = slice(start, start + length)
        rows = {}
        for key, name in counts.items():
            n = int(batch[key][i])
            rows[name] = batch[name][at[name] : at[name] + n] if n else None
            for extra, leader in (follows or {}).items():
                if leader == name:
                    rows[extra] = batch[extra][at[name] : at[name] + n] if n else None
            at[name] += n
        if any(v is not None for v in rows.values()):
            pos = rope_index(tokens, rows)
        else:  # text only: the three axes advance together
            pos = torch.arange(length, device=ids.device).view(1, 1, -1).expand(3, 1, -1)
        text = torch.arange(length, device=ids.device).view(1, 1, -1)
        parts.append(torch.cat([text, pos.to(text.dtype)]))
        start += length
    return torch.cat(parts, dim=2)
