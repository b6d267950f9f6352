"""Ming-Lite-Omni's side of preprocessing: LLaMA-Factory / MindSpeed-MM MLLM JSON (``messages``
+ ``images``, also ``audios``; text-only samples mixed in) turned into the token rows the
reference's processor and MindSpeed-MM's ``vl_dataset.py`` make.

- Turns: ``<role>HUMAN</role>`` before a user turn, ``<role>ASSISTANT</role>`` before an
  answer (``processing_bailingmm``'s ``USER_PREFIX`` / ``ASSISTANT_PREFIX``); the answer ends
  with ``<|endoftext|>`` (the reference's generation stops there), which is supervised with it.
- A picture: ``<image>``, one ``<imagePatch>`` per merged 2 x 2 patch, ``</image>``, then
  ``"\\n"`` (``_expand_image_tokens``); patches from transformers' PIL Qwen2-VL image
  processor (CLIP's mean and std, the release's ``preprocessor_config.json``), the pixel budget
  from ``data.image_min_pixels`` / ``image_max_pixels``.
- A clip: ``<audio>``, one ``<audioPatch>`` per LFR feature row, ``</audio>``
  (``_expand_audio_tokens`` with the release's ``ds_stride`` 1); the rows are the Kaldi fbank
  (80 mels, 25 / 10 ms, of the samples scaled to 16-bit range) stacked 7 frames every 6 (LFR),
  as the release's ``WavFrontend``
  (``mmcore.data.lfr_features``). The release also applies the CMVN of its ``am.mvn`` file; where the
  model folder has one, it is applied here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mmcore.data import ChatTemplateEncoder, MediaError, Piece

IMAGE, IMAGE_PATCH, IMAGE_END = "<image>", "<imagePatch>", "</image>"
AUDIO, AUDIO_PATCH, AUDIO_END = "<audio>", "<audioPatch>", "</audio>"
EOS = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<role>HUMAN</role>{% elif message['role'] == 'assistant' %}<role>ASSISTANT</role>{% else %}<role>SYSTEM</role>{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% elif part['type'] == 'audio' %}<audio>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% if message['role'] == 'assistant' %}<|endoftext|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
)


@dataclass
class ImageExpander:
    """``<image>`` -> start, ``<imagePatch>`` x merged patches, end; the patches and their grid."""

    processor: Any
    merge: int
    tokens: tuple[int, int, int]

    def __call__(self, path: Path) -> Piece:
        from mmcore.data import load_image

        out = self.processor(images=[load_image(path)], return_tensors="np")
        grid = out["image_grid_thw"][0].tolist()
        start, patch, end = self.tokens
        return Piece([start, *[patch] * (grid[0] * grid[1] * grid[2] // self.merge**2), end], {"pixel_values": out["pixel_values"], "image_grid_thw": [grid]})


@dataclass
class ClipExpander:
    """``<audio>`` -> start, ``<audioPatch>`` x LFR rows, end; the clip's rows [rows, 560]."""

    tokens: tuple[int, int, int]
    cmvn: Any = None
    max_rows: int = 3000

    def __call__(self, path: Path) -> Piece:
        from mmcore.data import load_audio
        from mmcore.data import lfr_features

        samples = load_audio(path, 16000)
        # the release's WavFrontend scales [-1, 1] samples to 16-bit range first (upsacle_samples):
        # log-mel energies 30 ln 2 higher than the unscaled clip's
        rows = lfr_features(samples * 32768.0, {})
        if rows.shape[0] == 0:
            raise MediaError(f"audio {path} is empty (shorter than one 25 ms frame)")
        if rows.shape[0] > self.max_rows:
            raise MediaError(f"audio {path} is {len(samples) / 16000:.1f} s, longer than the {self.max_rows * 0.06:.0f} s a clip may have here (split it)")
        if self.cmvn is not None:
            rows = (rows + self.cmvn[0]) * self.cmvn[1]
        start, patch, end = self.tokens
        return Piece([start, *[patch] * int(rows.shape[0]), end], {"audio_feats": rows.numpy(), "audio_feats_lengths": [int(rows.shape[0])]})


def read_cmvn(path: Path) -> Any:
    """FunASR's ``am.mvn`` (Kaldi text: an ``<AddShift>`` row of shifts, a ``<Rescale>`` row of
    scales): (shift, scale) tensors, or None where the folder has no such file."""
    import re

    import torch

    if not path.is_file():
        return None
    text = path.read_text()
    rows = []
    for tag in ("<AddShift>", "<Rescale>"):
        found = re.search(re.escape(tag) + r"[^\[]*\[([^\]]*)\]", text)
        if found is None:
            raise MediaError(f"{path}: no {tag} row (a FunASR am.mvn file holds <AddShift> and <Rescale>)")
        rows.append(torch.tensor([float(v) for v in found.group(1).split()]))
    return rows[0], rows[1]


class Encoder(ChatTemplateEncoder):
    """:class:`~mmcore.data.mllm.Sample` -> token ids, labels, picture patches and clip rows."""

    def __init__(self, tokenizer: Any, model_dir: Path, data_cfg: Any, vision: Mapping[str, Any]) -> None:
        from mm_qwen_vision import image_processor

        self.cfg = data_cfg
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (IMAGE, IMAGE_PATCH, IMAGE_END, AUDIO, AUDIO_PATCH, AUDIO_END)}
        missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
        if missing:
            from mmcore.errors import StageError

            raise StageError(f"{model_dir}: the tokenizer has no {missing[0]} token (Ming's media tokens: {', '.join(ids)})")
        merge = int(vision.get("spatial_merge_size", 2))
        images = ImageExpander(image_processor(data_cfg.image_min_pixels, data_cfg.image_max_pixels, int(vision["patch_size"])), merge, (ids[IMAGE], ids[IMAGE_PATCH], ids[IMAGE_END]))
        clips = ClipExpander((ids[AUDIO], ids[AUDIO_PATCH], ids[AUDIO_END]), read_cmvn(Path(model_dir) / "am.mvn"))
        super().__init__(
            tokenizer,
            {IMAGE: images, AUDIO: clips},
            chat_template=CHAT_TEMPLATE,
            train_on_prompt=data_cfg.train_on_prompt,
            media_token_ids=[ids[t] for t in ids],
        )


def collate_clips(batch: dict[str, Any], samples: list[dict[str, Any]], ids: Mapping[str, int]) -> None:
    """``audio_feats`` [clips, longest, 560] zero-padded, ``audio_feats_lengths`` [clips] and
    ``audio_token_id``. A sample cut before some of its clips' tokens (evaluate's prompt)
    brings only the clips whose tokens it holds."""
    import torch

    runs, lengths = [], []
    for s in samples:
        if "audio_feats_lengths" not in s:
            continue
        held, kept = int((s["input_ids"] == ids["audio_token_id"]).sum()), []
        for n in s["audio_feats_lengths"].tolist():
            if sum(kept) + int(n) > held:
                break
            kept.append(int(n))
        if kept:
            runs.append(torch.as_tensor(s["audio_feats"][: sum(kept)]).float())
            lengths.extend(kept)
    if not lengths:
        return
    flat = torch.cat(runs)
    out = torch.zeros(len(lengths), max(lengths), flat.shape[1])
    for clip, rows in enumerate(torch.split(flat, lengths)):
        out[clip, : len(rows)] = rows
    batch["audio_feats"], batch["audio_feats_lengths"] = out, torch.tensor(lengths)
    batch["audio_token_id"] = torch.tensor(ids["audio_token_id"])
