"""Audio clips as log-mel frames for a VLM-kit family with a Whisper-style audio tower
(Qwen2.5-Omni, Qwen3-Omni): the placeholder expander, the batch fields, the tower's cost and
the frozen-tower cache helpers.

A clip is decoded at the feature extractor's rate, turned into mel frames by transformers'
``WhisperFeatureExtractor`` exactly as the family's processor calls it, and becomes ``<start>
<pad> * n <end>`` with n what the family's tower makes of its frames. A sample stores the valid
frames of all its clips concatenated (``input_features`` [frames, mels]) and each clip's frame
count (``audio_feature_lengths``); a batch carries them as ``input_features`` [clips, mels,
longest] zero-padded with ``feature_attention_mask``, the layout the towers take.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from mmcore.data.chatml import Piece
from mmcore.data.media import MediaError

__all__ = ["MelClipExpander", "collate_mel_clips", "pad_clips", "mel_tower_tokens", "audio_clips", "clip_key", "use_cached_audio"]


@dataclass
class MelClipExpander:
    """``<audio>`` -> tokens and valid mel frames, as the family's processor makes them.

    Args:
        feature_extractor: the family's ``WhisperFeatureExtractor``.
        tokens: (start, pad, end) token ids.
        tokens_of: frames -> audio tokens the tower makes of them.
        pad_to_window: pad to the extractor's 30 s window, then keep the valid frames
            (Qwen2.5-Omni's processor), rather than pad nothing (Qwen3-Omni's ``padding=True``,
            each clip as the processor makes it when given that clip alone). The last frame of a
            clip differs between the two (zeros or reflection after the end), so it must be the
            family's.
        max_seconds: the longest clip the tower takes (None: any length).
    """

    feature_extractor: Any
    tokens: tuple[int, int, int]
    tokens_of: Callable[[int], int]
    pad_to_window: bool = True
    max_seconds: float | None = None

    def __call__(self, path: Path) -> Piece:
        from mmcore.data.audio import load_audio

        fe = self.feature_extractor
        samples = load_audio(path, fe.sampling_rate)
        seconds = len(samples) / fe.sampling_rate
        if self.max_seconds is not None and seconds > self.max_seconds:
            raise MediaError(f"audio {path} is {seconds:.1f} s, longer than the {self.max_seconds:g} s the audio tower takes (split it)")
        how = {} if self.pad_to_window else {"padding": True, "truncation": False}
        out = fe(samples, sampling_rate=fe.sampling_rate, return_attention_mask=True, return_tensors="np", **how)
        frames = int(out["attention_mask"][0].sum())
        if frames == 0:
            raise MediaError(f"audio {path} is empty")
        start, pad, end = self.tokens
        features = out["input_features"][0][:, :frames].T.copy()  # [frames, mels]
        return Piece([start, *[pad] * int(self.tokens_of(frames)), end], {"input_features": features, "audio_feature_lengths": [frames]})


def collate_mel_clips(batch: dict[str, Any], samples: list[dict[str, Any]], ids: Mapping[str, int]) -> None:
    """A VLM kit ``collate_extra``: ``input_features`` [clips, mels, longest] and
    ``feature_attention_mask`` from the samples' frame runs (or, from the extract cache, the
    tower's outputs as they are), and ``audio_feature_lengths`` (packed positions read it)."""
    import torch

    lengths = [s["audio_feature_lengths"] for s in samples if "audio_feature_lengths" in s]
    if not lengths:
        return
    lengths = torch.cat(lengths)
    batch["audio_feature_lengths"] = lengths
    batch["feature_attention_mask"] = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).long()
    if any("audio_states" in s for s in samples):
        batch["input_features"] = torch.cat([s["audio_states"] for s in samples if "audio_states" in s])
    else:
        batch["input_features"] = pad_clips([s["input_features"] for s in samples if "input_features" in s], lengths)


def pad_clips(frames: list[Any], lengths: Any) -> Any:
    """Per-sample [frames, mels] runs -> [clips, mels, longest] zero-padded, as the processors pad."""
    import torch

    flat = torch.cat(frames)
    out = torch.zeros(len(lengths), flat.shape[1], int(lengths.max()))
    for clip, run in enumerate(torch.split(flat, lengths.tolist())):
        out[clip, :, : len(run)] = run.T
    return out


def mel_tower_tokens(tokens_of: Callable[[Any], Any]) -> Callable[[dict[str, Any]], float]:
    """A VLM kit ``towers`` entry: ``batch -> tokens through the tower's layers``, given what the
    tower's convolutions make of a clip's frames."""

    def tokens(batch: dict[str, Any]) -> float:
        return float(sum(tokens_of(int(n)) for n in batch["audio_feature_lengths"])) if "audio_feature_lengths" in batch else 0.0

    return tokens


def audio_clips(sample: dict[str, Any]) -> list[Any]:
    """One [frames, mels] tensor per clip of a stored sample."""
    import torch

    return list(torch.split(sample["input_features"], sample["audio_feature_lengths"].tolist())) if "input_features" in sample else []


def clip_key(frames: Any) -> str:
    """Content key of one clip's frames (identical clips are encoded once)."""
    return hashlib.sha256(frames.contiguous().numpy().tobytes()).hexdigest()


def use_cached_audio(inner: Any) -> None:
    """Make the model (the one holding ``get_audio_features``) pass cached tower outputs through."""
    from transformers.modeling_outputs import BaseModelOutput

    inner.get_audio_features = lambda input_features, *args, **kwargs: BaseModelOutput(last_hidden_state=input_features)
