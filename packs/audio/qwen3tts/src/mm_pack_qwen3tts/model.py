"""A Qwen3-TTS checkpoint folder in its public layout, loaded strictly.

The public layout (Qwen/Qwen3-TTS-12Hz-{0.6B,1.7B}-{Base,CustomVoice,VoiceDesign})::

    config.json             model_type qwen3_tts: talker_config (+ code_predictor_config),
                            speaker_encoder_config, tts_model_type, special token ids
    model.safetensors       talker.* (and speaker_encoder.* in the Base models, tts_model_type "base")
    speech_tokenizer/       the 12 Hz codec (its own config.json + model.safetensors)
    vocab.json, merges.txt, tokenizer_config.json ...   the Qwen2 text tokenizer

:class:`Qwen3TTS` holds ``talker`` with the public names, so the root safetensors load with
``strict=True`` and need no renaming on their way to DCP (mmcore's convert stage).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from mmcore.engines import load_strictly
from mm_pack_qwen3tts.config import CheckpointError, SpecialIds, read_config, special_ids
from mm_pack_qwen3tts.talker import Talker


class Qwen3TTS(nn.Module):
    def __init__(self, cfg: dict) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.ids: SpecialIds = special_ids(cfg)
        self.tts_model_type = cfg.get("tts_model_type")
        self.talker = Talker(cfg["talker_config"])
        if self.tts_model_type == "base":  # voice cloning: the Base checkpoints carry the encoder
            from mm_pack_qwen3tts.speaker import SpeakerEncoder

            self.speaker_encoder = SpeakerEncoder(cfg.get("speaker_encoder_config") or {})

    @classmethod
    def from_pretrained(cls, model_dir: Path) -> "Qwen3TTS":
        """A public-layout folder, loaded strictly (:func:`load_pretrained`)."""
        return load_pretrained(model_dir)

    def forward(self, batch: dict, reduction: str = "sum") -> dict:  # type: ignore[type-arg]
        """The teacher-forced loss of a collated batch (:func:`mm_pack_qwen3tts.train.collate`):
        the root forward, so a sharded model gathers its own parameters (FSDP2)."""
        from mm_pack_qwen3tts.speech import batch_layouts, loss

        return loss(self.talker, batch_layouts(self.ids, batch), reduction=reduction)


def build_model(model_dir: Path, checkpoint: Path | None = None) -> Qwen3TTS:
    """The training model from a folder's config.json (random weights); with ``checkpoint``, its DCP loaded."""
    model = Qwen3TTS(read_config(Path(model_dir)))
    if checkpoint is not None:
        from mmcore.train import load_converted

        load_converted(model, Path(checkpoint))
    return model


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's root ``*.safetensors`` (one file or shards)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no model.safetensors")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: unreadable safetensors ({' '.join(str(exc).split())})") from None
    return state


def load_pretrained(model_dir: Path, dtype: torch.dtype | None = None) -> Qwen3TTS:
    """The folder's model with its weights loaded ``strict=True``; a missing, unexpected or
    misshapen tensor is one line naming the first of them."""
    model = build_model(Path(model_dir))
    state = read_weights(Path(model_dir))
    load_strictly(model, state, model_dir, "the model config.json describes", error=CheckpointError)
    if dtype is not None:
        model.to(dtype)
    return model.eval()


def load_codec(model_dir: Path):  # type: ignore[no-untyped-def]
    """``speech_tokenizer/``'s decoder, its ``decoder.*`` tensors loaded ``strict=True`` (the
    ``encoder.*`` ones: :func:`load_speech_encoder`)."""
    from mm_pack_qwen3tts.codec import SpeechTokenizer

    folder = Path(model_dir) / "speech_tokenizer"
    cfg = codec_config(model_dir)
    codec = SpeechTokenizer(cfg)
    state = {k: v for k, v in read_weights(folder).items() if k.startswith("decoder.")}
    load_strictly(codec, state, folder, "the decoder its config.json describes", error=CheckpointError)
    return codec.eval()


def codec_config(model_dir: Path) -> dict:  # type: ignore[type-arg]
    import json

    folder = Path(model_dir) / "speech_tokenizer"
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{model_dir}: no speech_tokenizer/config.json (the 12 Hz codec)")
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if cfg.get("model_type") != "qwen3_tts_tokenizer_12hz":
        raise CheckpointError(f"{folder / 'config.json'}: model_type {cfg.get('model_type')!r}; only the 12 Hz tokenizer (qwen3_tts_tokenizer_12hz) is supported")
    return cfg


def load_speech_encoder(model_dir: Path):  # type: ignore[no-untyped-def]
    """``speech_tokenizer/``'s encoder (audio -> codes), its ``encoder.*`` tensors (the public
    transformers-4.57 names) renamed onto transformers 5.25's Mimi pieces and loaded
    ``strict=True``; a tensor that is neither the encoder's nor ``decoder.*`` is an error too."""
    from mm_pack_qwen3tts.encoder import SpeechEncoder, to_own

    folder = Path(model_dir) / "speech_tokenizer"
    encoder = SpeechEncoder(codec_config(model_dir))
    state, stray = {}, []
    for key, value in read_weights(folder).items():
        own = to_own(key)
        if own is not None:
            state[own] = value
        elif not key.startswith("decoder."):
            stray.append(key)
    if stray:
        raise CheckpointError(f"{folder}: unexpected {stray[0]} ({len(stray)} tensors neither the encoder's nor the decoder's)")
    load_strictly(encoder, state, folder, "the encoder its config.json describes (encoder.* keys)", error=CheckpointError)
    return encoder.eval()
