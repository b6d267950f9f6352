"""The Qwen vision tower's input side, shared by the Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and the
Qwen omni packs.

Images go through transformers' own PIL image processor (no torchvision); video frames are
sampled with PyAV, go through the same processor and are paired into temporal patches. The
placeholder of an image or video becomes ``<start> <pad> * (patches / merge**2) <end>``; the
start/pad/end token names differ per family and are given by the pack.

Also here: the frozen-tower cache helpers (content keys per item, the merger-only forward); in
submodules the Qwen text kernels (``kernels``), DeepStack in the cache (``deepstack``), the extract
stage (``extract``), the omni processors without torchvision (``processors``) and tiny tokenizers
(``tiny``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import Field

from mmcore.data import Piece, MLLMDataSection, MediaError, load_image

__all__ = [
    "QwenVisionData",
    "image_processor",
    "load_video_frames",
    "sample_video",
    "SampledVideo",
    "frame_timestamps",
    "video_patches",
    "QwenVisionExpanders",
    "split_items",
    "media_key",
    "use_cached_vision",
    "packed_mrope_positions",
    "QWEN_MEDIA_FIELDS",
    "QWEN_PACKED_COUNTS",
    "mm_token_types",
    "rope_index_positions",
]


class QwenVisionData(MLLMDataSection):
    """MLLM JSON options plus the Qwen vision tower's pixel budgets and video sampling."""

    image_min_pixels: int = Field(56 * 56, ge=28 * 28, description="Images smaller than this are upscaled.")
    image_max_pixels: int = Field(512 * 28 * 28, ge=28 * 28, description="Images larger than this are downscaled.")
    video_fps: float = Field(2.0, gt=0, description="Frames sampled per second of video.")
    video_max_frames: int = Field(16, ge=2, description="At most this many frames per video (even: 2 frames per temporal patch).")
    video_max_pixels: int = Field(128 * 28 * 28, ge=28 * 28, description="Pixel budget of each video frame.")


def image_processor(min_pixels: int = 56 * 56, max_pixels: int = 512 * 28 * 28, patch_size: int = 14, mean_std: tuple[float, float] | None = None):  # type: ignore[no-untyped-def]
    """transformers' PIL Qwen2-VL image processor (no torchvision); ``patch_size`` 16 and
    ``mean_std`` (0.5, 0.5) are Qwen3-VL's settings, the defaults Qwen2-VL's (CLIP's statistics)."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    except ImportError:
        from mmcore import missing_dependency

        raise missing_dependency("transformers", "the Qwen image processor") from None

    extra = {"image_mean": [mean_std[0]] * 3, "image_std": [mean_std[1]] * 3} if mean_std else {}
    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=patch_size, **extra)


def load_video_frames(path: Path, fps: float, max_frames: int) -> list[Any]:
    """Frames sampled at ``fps`` (at most ``max_frames``, an even count) as PIL images, via PyAV."""
    return sample_video(path, fps, max_frames).frames


@dataclass(frozen=True)
class SampledVideo:
    """The frames taken from a video, which of the source's frames they are, and its frame rate."""

    frames: list[Any]
    indices: list[int]
    source_fps: float


def sample_video(path: Path, fps: float, max_frames: int) -> SampledVideo:
    """Frames sampled at ``fps`` (at most ``max_frames``, an even count: the last is repeated
    where the count is odd, as the Qwen processors pad a temporal patch), via PyAV."""
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
    indices = [min(int(i * step), len(frames) - 1) for i in range(max(2, int(len(frames) / step)))]
    indices = indices[: max_frames - max_frames % 2]
    if len(indices) % 2:
        indices.append(indices[-1])  # two frames per temporal patch
    return SampledVideo([frames[i].convert("RGB") for i in indices], indices, rate)


def frame_timestamps(indices: list[int], source_fps: float, temporal_patch: int = 2) -> list[float]:
    """Seconds of each temporal patch: the mean time of its first and last frame (Qwen3-VL's
    ``<t seconds>`` text before each frame's tokens)."""
    seconds = [i / source_fps for i in indices]
    return [(seconds[i] + seconds[i + temporal_patch - 1]) / 2 for i in range(0, len(seconds), temporal_patch)]


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
        patch_size / mean_std: the image processor's patch size and normalisation
            (:func:`image_processor`).
        processor: ``(min_pixels, max_pixels) -> image processor`` where the family has its own
            (one that patchifies as Qwen2-VL's does: GLM-4V's); default :func:`image_processor`.
        video_ids: ``(grid, sampled video, tokens per temporal patch) -> ids`` where the family
            writes a video as something other than ``start pads end`` (Qwen3-VL's and GLM-4V's
            per-frame timestamps).
    """

    data_cfg: Any
    merge: int
    image_tokens: tuple[int, int, int]
    video_tokens: tuple[int, int, int]
    seconds_per_grid: bool = False
    patch_size: int = 14
    mean_std: tuple[float, float] | None = None
    processor: Callable[[int, int], Any] | None = None
    video_ids: Callable[[list[int], "SampledVideo", int], list[int]] | None = None

    def __post_init__(self) -> None:
        cfg = self.data_cfg
        make = self.processor or (lambda low, high: image_processor(low, high, self.patch_size, self.mean_std))
        self.images = make(cfg.image_min_pixels, cfg.image_max_pixels)
        self.frames = make(min(cfg.image_min_pixels, cfg.video_max_pixels), cfg.video_max_pixels)

    def _tokens(self, grid: list[int], tokens: tuple[int, int, int]) -> list[int]:
        start, pad, end = tokens
        return [start, *[pad] * (grid[0] * grid[1] * grid[2] // self.merge**2), end]

    def image(self, path: Path) -> Piece:
        out = self.images(images=[load_image(path)], return_tensors="np")
        grid = out["image_grid_thw"][0].tolist()
        return Piece(self._tokens(grid, self.image_tokens), {"pixel_values": out["pixel_values"], "image_grid_thw": [grid]})

    def video(self, path: Path) -> Piece:
        video = sample_video(path, self.data_cfg.video_fps, self.data_cfg.video_max_frames)
        patches, grid = video_patches(video.frames, self.frames)
        fields: dict[str, Any] = {"pixel_values_videos": patches, "video_grid_thw": [grid]}
        if self.seconds_per_grid:
            fields["video_second_per_grid"] = [self.frames.temporal_patch_size / self.data_cfg.video_fps]
        if self.video_ids is None:
            return Piece(self._tokens(grid, self.video_tokens), fields)
        return Piece(self.video_ids(grid, video, grid[1] * grid[2] // self.merge**2), fields)


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

    Positions are integers unless a sample's are fractional (then the row is float, as the
    model's own positions are).

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
        # Qwen3-Omni's time axis is fractional (seconds x position ids per second): kept as is
        parts.append(torch.cat([text.to(pos.dtype), pos]) if pos.is_floating_point() else torch.cat([text, pos.to(text.dtype)]))
        start += length
    return torch.cat(parts, dim=2)


#: What a Qwen vision sample brings to the model, concatenated across a batch.
QWEN_MEDIA_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
#: Packed-row counts: batch key -> the field whose rows each sample brings.
QWEN_PACKED_COUNTS = {"segment_images": "image_grid_thw", "segment_videos": "video_grid_thw"}


def mm_token_types(batch: dict[str, Any], samples: list[dict[str, Any]], ids: dict[str, int]) -> None:
    """``mm_token_type_ids`` (0 text, 1 image, 2 video): where M-RoPE places media (a VLM kit
    ``collate_extra``)."""
    tokens = batch["input_ids"]
    batch["mm_token_type_ids"] = (tokens == ids["image_token_id"]).long() + 2 * (tokens == ids["video_token_id"]).long()


def rope_index_positions(model: Any, batch: dict[str, Any]) -> Any:
    """M-RoPE positions of a packed row from the model's own ``get_rope_index`` (Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL: same signature), restarted per sample (a VLM kit ``packed_positions``)."""

    def rope_index(tokens: slice, rows: dict[str, Any]) -> Any:
        pos, _ = model.model.get_rope_index(batch["input_ids"][:, tokens], batch["mm_token_type_ids"][:, tokens], image_grid_thw=rows["image_grid_thw"], video_grid_thw=rows["video_grid_thw"])
        return pos

    return packed_mrope_positions(batch, QWEN_PACKED_COUNTS, rope_index)
