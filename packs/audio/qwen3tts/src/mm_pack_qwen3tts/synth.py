"""Text ids -> codes (the talker) -> waveform (the speech tokenizer's decoder) -> a wav file
(mmcore's ``write_audio``: 16-bit PCM)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mm_pack_qwen3tts.codec import SpeechTokenizer
from mm_pack_qwen3tts.model import Qwen3TTS
from mm_pack_qwen3tts.speech import Sampling, generate_codes


@dataclass
class Speech:
    codes: torch.Tensor  # frames x code groups
    wav: torch.Tensor  # samples, float in [-1, 1]
    sample_rate: int

    def write(self, path: Path) -> Path:
        from mmcore.data import write_audio

        return write_audio(Path(path), self.wav.float().numpy(), self.sample_rate)


@torch.inference_mode()
def synthesize(
    model: Qwen3TTS,
    codec: SpeechTokenizer,
    text_ids: list[int],
    *,
    speaker: str | None = None,
    language: str | None = None,
    streaming: bool = False,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
    max_frames: int = 4096,
) -> Speech:
    """Speak ``text_ids`` (the tokenised ``<|im_start|>assistant\\n{text}``) in a CustomVoice
        ``speaker`` (a name of ``spk_id``) and ``language`` (a name of ``codec_language_id``; None:
        the reference's "auto"). ``sampling=None`` is greedy at both levels; ``streaming``: the
    streaming prompt layout (:func:`~mm_pack_qwen3tts.speech.layout`)."""
    ids = model.ids
    if speaker is not None and speaker.lower() not in ids.spk_id:
        raise ValueError(f"speaker {speaker!r} is not one of this checkpoint's: {', '.join(sorted(ids.spk_id)) or 'none'}")
    if language is not None and language.lower() not in ids.codec_language_id:
        raise ValueError(f"language {language!r} is not one of this checkpoint's: {', '.join(sorted(ids.codec_language_id))}")
    codes = generate_codes(
        model.talker,
        ids,
        text_ids,
        speaker=ids.spk_id[speaker.lower()] if speaker else None,
        language=ids.codec_language_id[language.lower()] if language else None,
        streaming=streaming,
        sampling=sampling,
        sub_sampling=sampling,
        generator=generator,
        max_frames=max_frames,
    )
    if not len(codes):
        raise ValueError("the talker stopped before the first frame")
    return Speech(codes=codes, wav=codec.decode(codes), sample_rate=codec.sample_rate)
