"""Filler samples: the same tower calls on every rank, whatever its micro-batch holds.

Under FSDP2 every tower block is its own sharded unit: calling it all-gathers its weights and its
backward reduce-scatters its gradients. transformers calls a tower only when its input is there,
so when one rank's micro-batch has an image and another's has none, their collectives differ: gloo
aborts ("Received data size doesn't match expected size"), NCCL hangs.

A *filler* is the smallest sample of one media kind (``image``, ``video``, ``audio``): one media
item made by the family's own expander (its placeholder tokens and arrays), every label -100.
Preprocess writes one per kind the data holds (:func:`encode_fillers`); before each step, the
ranks tell each other which kinds each of their micro-batches hold (one all-reduce, the one that
already sums the step's loss tokens), and a rank lacking a kind some other rank has appends that
kind's filler to the tail of its last sample (:func:`append_fillers`). Every rank then calls
every tower in the order the model calls them, so the collectives agree for any family and any
number of towers, frozen, cached, LoRA-wrapped or trained.

Why the tail of a sample: the text decoders are causal, so tokens after a sample's own never
change its logits; the filler's labels are -100, so no loss flows back through it and the
towers' gradients from it are exact zeros (the true gradients, summed with zero). Padded rows
grow by the filler's few tokens at most; in a packed row the filler shares the last segment, so
the segment count (DPO's rows) is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

if TYPE_CHECKING:
    import torch

#: media kind -> the dataset field (LLaMA-Factory's) and the placeholder that bring it
KINDS = {"image": ("images", "<image>"), "video": ("videos", "<video>"), "audio": ("audios", "<audio>")}

Batch = dict[str, Any]


def write_filler_media(folder: Path, kind: str) -> Path:
    """The filler's media file: a grey 56x56 image, a 4-frame 56x56 clip at 4 fps, or half a
    second of a quiet tone at 16 kHz (the same bytes on every machine)."""
    import numpy as np

    if kind == "image":
        from PIL import Image

        path = folder / "filler.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (56, 56), (128, 128, 128)).save(path)
        return path
    if kind == "video":
        from mmcore.data.video import write_mp4

        path = folder / "filler.mp4"
        write_mp4(path, np.full((4, 56, 56, 3), 128, dtype=np.uint8), 4)
        return path
    if kind == "audio":
        from mmcore.data.audio import write_audio

        rate = 16000
        return write_audio(folder / "filler.wav", 0.1 * np.sin(2 * np.pi * 440 * np.arange(rate // 2) / rate), rate)
    raise ValueError(f"no filler for media kind {kind!r} (known: {', '.join(KINDS)})")


def kinds_in(samples: Any) -> list[str]:
    """The media kinds (:data:`KINDS`) that parsed samples (:class:`~mmcore.data.mllm.Sample`,
    or preference pairs with a ``chosen`` sample) bring, in :data:`KINDS` order."""
    present: set[str] = set()
    for sample in samples:
        media = getattr(sample, "media", None) or getattr(getattr(sample, "chosen", None), "media", None) or {}
        present.update(kind for kind, (key, _) in KINDS.items() if media.get(key))
    return [kind for kind in KINDS if kind in present]


def encode_fillers(encoder: Any, kinds: Sequence[str], folder: Path) -> dict[str, dict[str, "torch.Tensor"]]:
    """kind -> the filler sample of that kind (``input_ids``, ``labels`` all -100, media
    fields), made by ``encoder``'s expander for the kind's placeholder; a kind the encoder has
    no expander for is left out (its samples could not have been encoded either)."""
    import torch

    from mmcore.train.causal_lm import IGNORE
    from mmcore.data.chat_template import Encoded

    expanders: Mapping[str, Callable[[Path], Any]] = getattr(encoder, "expanders", {})
    out = {}
    for kind in kinds:
        placeholder = KINDS[kind][1]
        if placeholder not in expanders:
            continue
        piece = expanders[placeholder](write_filler_media(folder / kind, kind))
        encoded = Encoded(list(piece.ids), [IGNORE] * len(piece.ids), {name: [value] for name, value in piece.fields.items()})
        out[kind] = {"input_ids": torch.tensor(encoded.input_ids), "labels": torch.tensor(encoded.labels), **encoded.tensors}
    return out


def append_fillers(sample: Mapping[str, Any], fillers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``sample`` with each filler's tokens after its own and each filler's arrays after its own
    (every stored field is per-item rows joined along the first axis, as collation joins samples)."""
    import torch

    out = dict(sample)
    for filler in fillers:
        for name, value in filler.items():
            out[name] = torch.cat([out[name], value]) if name in out else value
    return out


@dataclass(frozen=True)
class MediaKinds:
    """Which media kinds each sample holds, for the train engine to tell whether a step's ranks
    held different media (a recipe's ``media``, or the base of its ``fill``).

    Attributes:
        kinds: the media kinds, in a fixed order (the same on every rank).
        kinds_of: dataset index -> the kinds that sample holds (from the dataset index, without
            reading the sample).
    """

    kinds: tuple[str, ...]
    kinds_of: Callable[[int], Collection[str]]

    def presence(self, batches: Sequence[Sequence[int]]) -> list[float]:
        """1.0 where micro-batch ``b`` (its dataset indices) holds kind ``k``, row-major [b, k]."""
        out = []
        for indices in batches:
            held = set().union(*(self.kinds_of(i) for i in indices)) if indices else set()
            out += [float(kind in held) for kind in self.kinds]
        return out


@dataclass(frozen=True)
class Fill(MediaKinds):
    """What the train engine needs to keep every rank's forward calls alike (a recipe's ``fill``):
    the :class:`MediaKinds` that have a filler, and how to collate one in.

    Attributes:
        collate: ``(samples, kinds) -> batch``: the samples collated with the fillers of
            ``kinds`` appended (:func:`append_fillers`).
    """

    collate: Callable[[list[Any], Sequence[str]], Batch]

    def missing(self, local: Sequence[float], summed: Sequence[float]) -> list[list[str]]:
        """Per micro-batch, the kinds some rank holds and this one lacks (``local``: this rank's
        :meth:`presence`; ``summed``: the same summed over ranks)."""
        width = len(self.kinds)
        return [[kind for k, kind in enumerate(self.kinds) if summed[b * width + k] > 0 and not local[b * width + k]] for b in range(len(local) // width if width else 0)]


def kinds_by_fields(fields: Mapping[str, Collection[str]], media_of: Callable[[int], Collection[str]]) -> Callable[[int], set[str]]:
    """``index -> kinds``: a sample holds a kind when it has one of the media fields that kind's
    filler brings (``fields``: kind -> its filler's media fields; ``media_of``: the sample's
    media field names, both as preprocess recorded them)."""

    def kinds(i: int) -> set[str]:
        mine = set(media_of(i))
        return {kind for kind, names in fields.items() if mine & set(names)}

    return kinds


__all__ = ["KINDS", "Fill", "MediaKinds", "append_fillers", "encode_fillers", "kinds_by_fields", "kinds_in", "write_filler_media"]
