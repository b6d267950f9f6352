"""InternVL's side of preprocessing: images as tiles, videos as frames, through the chat template.

An image becomes ``<img>`` + ``<IMG_CONTEXT>`` x (image_seq_length x tiles) + ``</img>`` and its
tiles ``pixel_values`` ([tiles, 3, S, S]), exactly as ``InternVLProcessor`` makes them: the
family's own PIL image processor (GotOcr2's, no torchvision) cuts it into the tiling closest to
its aspect ratio (``data.image_min_tiles``..``image_max_tiles``) plus a thumbnail. A video
becomes ``Frame1: <img>...</img>\\nFrame2: ...``, one untiled tile per frame sampled with PyAV
at ``data.video_fps`` (what the processor writes for a video). Images and video frames share
``pixel_values`` in order of appearance, as the model expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcore.data import ChatTemplateEncoder, Piece, frames_at, load_image, probe, sample_frames

START, CONTEXT, END = "<img>", "<IMG_CONTEXT>", "</img>"

# The chat template saved with tokenizers this pack writes: InternVL's ChatML, images and videos
# written as the processor's markers, so exported models format conversations as training did.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}" + CONTEXT + "\n"
    "{% elif content['type'] == 'video' %}<video>\n{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def image_processor(model_dir: Path) -> Any:
    """The checkpoint's image processor settings (tile size, normalisation) on transformers'
    PIL backend, which needs no torchvision."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    return GotOcr2ImageProcessorPil.from_pretrained(model_dir)


class Encoder(ChatTemplateEncoder):
    """Turns :class:`~mmcore.data.mllm.Sample` into token ids, labels and tiles."""

    def __init__(self, tokenizer: Any, data_cfg: Any, config: Any, model_dir: Path) -> None:
        ids = tokenizer.convert_tokens_to_ids
        self.cfg = data_cfg
        self.processor = image_processor(model_dir)
        self.tokens_per_tile = int(config.image_seq_length)
        self.start, self.context, self.end = ids(START), ids(CONTEXT), ids(END)
        self.text = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
        super().__init__(
            tokenizer,
            {"<image>": self.image, "<video>": self.video},
            markers={"<image>": CONTEXT + "\n", "<video>": "<video>\n"},
            chat_template=getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[self.start, self.context, self.end],
        )

    def _tiles(self, images: list[Any], tiled: bool) -> Any:
        out = self.processor(images=images, crop_to_patches=tiled, min_patches=self.cfg.image_min_tiles, max_patches=self.cfg.image_max_tiles, return_tensors="np")
        return out["pixel_values"]

    def image(self, path: Path) -> Piece:
        tiles = self._tiles([load_image(path)], tiled=True)
        # the template's marker ends with "\n", which the processor keeps after </img>
        return Piece([self.start, *[self.context] * (self.tokens_per_tile * len(tiles)), self.end, *self.text("\n")], {"pixel_values": tiles})

    def video(self, path: Path) -> Piece:
        info = probe(path)
        frames = sample_frames(path, info, fps=self.cfg.video_fps, count=min(frames_at(info, self.cfg.video_fps), self.cfg.video_max_frames))
        tiles = self._tiles(frames, tiled=False)
        ids: list[int] = []
        for i in range(len(frames)):
            ids += self.text(("\n" if i else "") + f"Frame{i + 1}: ") + [self.start, *[self.context] * self.tokens_per_tile, self.end]
        return Piece(ids + self.text("\n"), {"pixel_values": tiles})
