"""Qwen2-VL's side of preprocessing: chat template, label masking, image and video patches.

A sample becomes ``input_ids``, ``labels`` (-100 outside assistant turns), and for its media
``pixel_values``/``image_grid_thw`` and ``pixel_values_videos``/``video_grid_thw`` exactly as
``Qwen2VLProcessor`` would make them (the image processor is transformers' own; video frames go
through it too, then are paired into temporal patches).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmcore.data.mllm import Sample
from mmcore.data.video import MediaError, load_image

__all__ = ["MediaError", "load_image", "Encoder", "image_processor", "load_video_frames", "video_patches"]

DEFAULT_SYSTEM = "You are a helpful assistant."
IGNORE = -100

# The chat template saved with tokenizers this pack writes, so that exported models format
# conversations for inference the same way training did.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_PLACEHOLDER = re.compile(r"(<image>|<video>)")


def image_processor(min_pixels: int = 56 * 56, max_pixels: int = 512 * 28 * 28):  # type: ignore[no-untyped-def]
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

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
    """Qwen2-VL video patches: each frame through the image processor, frames paired in time."""
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
class Encoded:
    input_ids: list[int]
    labels: list[int]
    tensors: dict[str, Any]


class Encoder:
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels and pixel patches."""

    def __init__(self, tokenizer: Any, data_cfg: Any, merge_size: int = 2) -> None:
        self.tok = tokenizer
        self.cfg = data_cfg
        self.merge = merge_size
        self.images = image_processor(data_cfg.image_min_pixels, data_cfg.image_max_pixels)
        self.frames = image_processor(min(data_cfg.image_min_pixels, data_cfg.video_max_pixels), data_cfg.video_max_pixels)
        self.ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")}

    def text(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) if text else []

    def encode(self, sample: Sample) -> Encoded:
        import numpy as np
        import torch

        pixel, grids, vpixel, vgrids = [], [], [], []
        images, videos = iter(sample.images), iter(sample.videos)
        ids: list[int] = []
        labels: list[int] = []
        turns = sample.turns if sample.turns[0].role == "system" else [type(sample.turns[0])("system", DEFAULT_SYSTEM), *sample.turns]
        for turn in turns:
            head = [self.ids["<|im_start|>"], *self.text(f"{turn.role}\n")]
            body: list[int] = []
            for piece in _PLACEHOLDER.split(turn.content):
                if piece == "<image>":
                    out = self.images(images=[load_image(next(images))], return_tensors="np")
                    pixel.append(out["pixel_values"])
                    grid = out["image_grid_thw"][0].tolist()
                    grids.append(grid)
                    body += [self.ids["<|vision_start|>"], *[self.ids["<|image_pad|>"]] * (int(np.prod(grid)) // self.merge**2), self.ids["<|vision_end|>"]]
                elif piece == "<video>":
                    frames = load_video_frames(next(videos), self.cfg.video_fps, self.cfg.video_max_frames)
                    patches, grid = video_patches(frames, self.frames)
                    vpixel.append(patches)
                    vgrids.append(grid)
                    body += [self.ids["<|vision_start|>"], *[self.ids["<|video_pad|>"]] * (int(np.prod(grid)) // self.merge**2), self.ids["<|vision_end|>"]]
                else:
                    body += self.text(piece)
            tail = [self.ids["<|im_end|>"]]
            newline = self.text("\n")
            ids += head + body + tail + newline
            supervised = turn.role == "assistant" or (self.cfg.train_on_prompt and turn.role == "user")
            labels += [IGNORE] * len(head) + (body + tail if supervised else [IGNORE] * (len(body) + 1)) + [IGNORE] * len(newline)
        tensors: dict[str, Any] = {}
        if pixel:
            tensors["pixel_values"] = torch.from_numpy(np.concatenate(pixel)).float()
            tensors["image_grid_thw"] = torch.tensor(grids, dtype=torch.long)
        if vpixel:
            tensors["pixel_values_videos"] = torch.from_numpy(np.concatenate(vpixel)).float()
            tensors["video_grid_thw"] = torch.tensor(vgrids, dtype=torch.long)
        return Encoded(ids, labels, tensors)

    def truncate(self, enc: Encoded) -> Encoded | str:
        """Cut to ``cutoff_len``; a cut through media tokens makes the sample bad (a reason)."""
        limit = self.cfg.cutoff_len
        if len(enc.input_ids) <= limit:
            return enc
        media = {self.ids["<|image_pad|>"], self.ids["<|video_pad|>"], self.ids["<|vision_start|>"], self.ids["<|vision_end|>"]}
        if any(t in media for t in enc.input_ids[limit:]):
            return f"{len(enc.input_ids)} tokens, and cutoff_len={limit} would cut through an image or video"
        if all(label == IGNORE for label in enc.labels[:limit]):
            return f"{len(enc.input_ids)} tokens, and cutoff_len={limit} would leave no assistant tokens to learn"
        return Encoded(enc.input_ids[:limit], enc.labels[:limit], enc.tensors)
