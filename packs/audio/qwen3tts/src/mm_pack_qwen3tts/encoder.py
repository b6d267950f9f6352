"""The 12 Hz speech tokenizer's encoder (``speech_tokenizer/``, ``encoder.*``): 24 kHz audio ->
12.5 Hz codes of ``encoder_valid_num_quantizers`` codebooks (the talker's training targets).

The reference (``Qwen3TTSTokenizerV2Encoder``) is transformers-4.57's ``MimiModel`` with its
decoding half removed, so the public tensors carry 4.57's names. transformers 5.25 split
``MimiModel`` into an encoder half (``MimiEncoderModel``: ``encoder_seanet``,
``encoder_transformer``, ``downsample``) and the quantizer at the top; the modules and their
tensors are otherwise the same, so the pack builds 5.25's pieces and renames two prefixes:

    encoder.encoder.*      -> seanet.*        (5.25: MimiEncoderModel.encoder_seanet)
    encoder.encoder_transformer.*, encoder.downsample.*  -> encoder.* (same names below)
    encoder.quantizer.*    -> quantizer.*     (5.25: MimiModel.quantizer)

The reference encodes with all ``num_quantizers`` (32 in the public config) and keeps the first
``encoder_valid_num_quantizers`` (16); residual quantization is sequential, so quantizing with
the first 16 alone gives the same codes. A clip of n samples gives ceil(n / 1920) frames (the
reference's cut of its padded batch).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

FULL_CAUSAL = 1 << 30

# public (4.57) prefix -> this module's
RENAMES = (
    ("encoder.encoder.", "encoder.encoder_seanet."),
    ("encoder.encoder_transformer.", "encoder.encoder_transformer."),
    ("encoder.downsample.", "encoder.downsample."),
    ("encoder.quantizer.", "quantizer."),
)


def to_own(key: str) -> str | None:
    """A public ``speech_tokenizer`` key -> this module's name (None: not the encoder's)."""
    for public, own in RENAMES:
        if key.startswith(public):
            return own + key[len(public) :]
    return None


def to_public(key: str) -> str:
    for public, own in RENAMES:
        if key.startswith(own):
            return public + key[len(own) :]
    raise KeyError(key)


def mimi_config(enc: dict[str, Any]) -> Any:
    """The public ``encoder_config`` (4.57 ``MimiConfig.to_dict()``) as 5.25's ``MimiEncoderConfig``:
    the fields are the same; 4.57 saved the frame rate as ``_frame_rate``, 5.25 reads ``frame_rate``,
    and ``rope_theta`` became ``rope_parameters``."""
    from transformers import MimiConfig
    from transformers.models.mimi.configuration_mimi import MimiEncoderConfig

    known = set(MimiConfig.__dataclass_fields__) if hasattr(MimiConfig, "__dataclass_fields__") else set()
    fields = {k: v for k, v in enc.items() if not known or k in known}
    fields.pop("encoder_config", None)
    fields.pop("decoder_config", None)
    if "_frame_rate" in enc or "frame_rate" in enc:
        fields["frame_rate"] = enc.get("frame_rate", enc.get("_frame_rate"))
    if "rope_theta" in enc and "rope_parameters" not in enc:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": float(enc["rope_theta"])}
    # transformers 4.57's Mimi builds a plain causal mask (its sliding window reaches only the
    # flash-attention kernel); under its default sdpa, which the reference runs, attention is
    # fully causal. 5.25 applies the window in every kernel: a window past any clip undoes that.
    fields["sliding_window"] = FULL_CAUSAL
    config = MimiEncoderConfig(**fields)
    config._attn_implementation = "sdpa"
    return config


class SpeechEncoder(nn.Module):
    """``encoder`` (transformers' ``MimiEncoderModel``) and ``quantizer`` (its
    ``MimiSplitResidualVectorQuantizer``), with the public config fields."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        from transformers.models.mimi.modeling_mimi import MimiEncoderModel, MimiSplitResidualVectorQuantizer

        self.config = mimi_config(cfg.get("encoder_config") or {})
        self.encoder = MimiEncoderModel(self.config)
        self.quantizer = MimiSplitResidualVectorQuantizer(self.config)
        self.num_quantizers = int(cfg.get("encoder_valid_num_quantizers", 16))
        self.sample_rate = int(cfg.get("input_sample_rate", 24000))
        self.samples_per_frame = int(cfg.get("encode_downsample_rate", 1920))
        if self.num_quantizers > self.config.num_quantizers:
            raise ValueError(f"encoder_valid_num_quantizers {self.num_quantizers} > the encoder's num_quantizers {self.config.num_quantizers}")

    @torch.no_grad()
    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """B x T waveforms (24 kHz, [-1, 1]) -> B x Q x ceil(T / samples_per_frame) codes (as
        ``MimiModel.encode``; a batch is encoded unmasked, so pad only clips of one length)."""
        latents = self.encoder(wav[:, None].to(next(self.parameters()).dtype)).latents
        codes = self.quantizer.encode(latents, self.num_quantizers).transpose(0, 1)
        return codes[..., : math.ceil(wav.shape[-1] / self.samples_per_frame)]

    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """One clip (T samples) -> F x Q codes, F = ceil(T / samples_per_frame) (the reference's
        ``Qwen3TTSTokenizerV2Model.encode`` of a one-clip batch)."""
        return self(wav.reshape(1, -1))[0].T.contiguous()
