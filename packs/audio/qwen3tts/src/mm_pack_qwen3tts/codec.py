"""The 12 Hz speech tokenizer's decoder (``speech_tokenizer/``, ``decoder.*``): codes -> 24 kHz waveform.

Decoder, as ``qwen_tts/core/tokenizer_12hz`` (names = the public ``decoder.*`` keys): split RVQ
(1 semantic + G-1 acoustic codebooks, each stored as ``embedding_sum`` / ``cluster_usage``,
1x1 conv projections), a causal conv, an 8-layer sliding-window transformer whose attention,
MLP and norms are transformers' Qwen3 modules (no q/k norm, with layer scales), two x2
transposed-conv + ConvNeXt upsamplers, then SnakeBeta / transposed-conv / dilated residual
blocks (x8, x5, x4, x3): ``prod(upsampling_ratios + upsample_rates)`` samples per frame.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class CausalConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride, self.span = stride, (kernel - 1) * dilation + 1
        self.pad = self.span - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = math.ceil((x.shape[-1] - self.span + self.pad) / self.stride + 1)
        extra = (frames - 1) * self.stride + (self.span - self.pad) - x.shape[-1]
        return self.conv(F.pad(x, (self.pad, extra)))


class CausalTransConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.trim] if self.trim > 0 else x


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x).transpose(1, 2)))))
        return x + (self.gamma * y).transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + sin^2(x e^alpha) / e^beta, per channel (log-scale parameters)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha, self.beta = nn.Parameter(torch.zeros(channels)), nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha, beta = self.alpha.exp()[None, :, None], self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1, self.conv1 = SnakeBeta(dim), CausalConv(dim, dim, 7, dilation=dilation)
        self.act2, self.conv2 = SnakeBeta(dim), CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, rate: int) -> None:
        super().__init__()
        self.block = nn.Sequential(SnakeBeta(c_in), CausalTransConv(c_in, c_out, 2 * rate, rate), *(ResidualUnit(c_out, d) for d in (1, 3, 9)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Codebook(nn.Module):
    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return F.embedding(codes, self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None])


class VQ(nn.Module):
    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self._codebook = Codebook(dim, size)


class _Layers(nn.Module):
    def __init__(self, n: int, dim: int, size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([VQ(dim, size) for _ in range(n)])


class RVQ(nn.Module):
    def __init__(self, n: int, dim: int, io_dim: int, size: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # unused when decoding, kept for the layout
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _Layers(n, dim, size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """B x n x T codes -> B x io_dim x T."""
        summed = sum(layer._codebook(codes[:, i]) for i, layer in enumerate(self.vq.layers))
        return self.output_proj(summed.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, n: int, codebook_dim: int, size: int) -> None:
        super().__init__()
        self.rvq_first = RVQ(1, codebook_dim // 2, codebook_dim, size)
        self.rvq_rest = RVQ(n - 1, codebook_dim // 2, codebook_dim, size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))


class TransformerLayer(nn.Module):
    """Pre-norm layer from transformers' Qwen3 attention (q/k norm removed), MLP and RMSNorms, with layer scales."""

    def __init__(self, config, index: int, init: float) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3MLP, Qwen3RMSNorm

        self.self_attn = Qwen3Attention(config, index)
        self.self_attn.q_norm, self.self_attn.k_norm = nn.Identity(), nn.Identity()
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn_layer_scale, self.mlp_layer_scale = LayerScale(config.hidden_size, init), LayerScale(config.hidden_size, init)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Any) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), position_embeddings=rope, attention_mask=mask)[0]
        x = x + self.self_attn_layer_scale.scale * attn
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class PreTransformer(nn.Module):
    def __init__(self, dec: dict[str, Any]) -> None:
        super().__init__()
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

        hidden, heads = int(dec.get("hidden_size", 1024)), int(dec.get("num_attention_heads", 16))
        self.config = Qwen3Config(
            vocab_size=1,
            hidden_size=hidden,
            intermediate_size=int(dec.get("intermediate_size", 3072)),
            num_hidden_layers=int(dec.get("num_hidden_layers", 8)),
            num_attention_heads=heads,
            num_key_value_heads=int(dec.get("num_key_value_heads", 16)),
            head_dim=int(dec.get("head_dim", hidden // heads)),
            hidden_act=dec.get("hidden_act", "silu"),
            max_position_embeddings=int(dec.get("max_position_embeddings", 8000)),
            rms_norm_eps=float(dec.get("rms_norm_eps", 1e-5)),
            rope_parameters={"rope_type": "default", "rope_theta": float(dec.get("rope_theta", 10000.0))},
            attention_bias=bool(dec.get("attention_bias", False)),
            use_sliding_window=True,
            sliding_window=int(dec.get("sliding_window", 72)),
            max_window_layers=0,  # every layer slides, as the reference's layer_types
        )
        self.config._attn_implementation = "sdpa"
        latent, init = int(dec.get("latent_dim", 1024)), float(dec.get("layer_scale_initial_scale", 0.01))
        self.layers = nn.ModuleList([TransformerLayer(self.config, i, init) for i in range(self.config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(hidden, eps=self.config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=self.config)
        self.input_proj, self.output_proj = nn.Linear(latent, hidden), nn.Linear(hidden, latent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_sliding_window_causal_mask

        x = self.input_proj(x)
        positions = torch.arange(x.shape[1], device=x.device)[None]
        mask = create_sliding_window_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=positions)
        rope = self.rotary_emb(x, positions)
        for layer in self.layers:
            x = layer(x, rope, mask)
        return self.output_proj(self.norm(x))


class CodecDecoder(nn.Module):
    def __init__(self, dec: dict[str, Any]) -> None:
        super().__init__()
        codebook_dim, latent, width = int(dec.get("codebook_dim", 512)), int(dec.get("latent_dim", 1024)), int(dec.get("decoder_dim", 1536))
        ratios, rates = [int(r) for r in dec.get("upsampling_ratios", (2, 2))], [int(r) for r in dec.get("upsample_rates", (8, 5, 4, 3))]
        self.num_quantizers = int(dec.get("num_quantizers", 16))
        self.samples_per_frame = math.prod(ratios + rates)
        self.quantizer = SplitRVQ(self.num_quantizers, codebook_dim, int(dec.get("codebook_size", 2048)))
        self.pre_conv = CausalConv(codebook_dim, latent, 3)
        self.pre_transformer = PreTransformer(dec)
        self.upsample = nn.ModuleList([nn.ModuleList([CausalTransConv(latent, latent, r, r), ConvNeXtBlock(latent)]) for r in ratios])
        blocks: list[nn.Module] = [CausalConv(latent, width, 7)]
        blocks += [DecoderBlock(width // 2**i, width // 2 ** (i + 1), r) for i, r in enumerate(rates)]
        out = width // 2 ** len(rates)
        self.decoder = nn.ModuleList([*blocks, SnakeBeta(out), CausalConv(out, 1, 7)])

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """B x Q x T codes -> B x 1 x (T * samples_per_frame) waveform in [-1, 1]."""
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(f"expected {self.num_quantizers} codebooks, got {codes.shape[1]}")
        x = self.pre_conv(self.quantizer.decode(codes))
        x = self.pre_transformer(x.transpose(1, 2)).transpose(1, 2)
        for conv, block in self.upsample:
            x = block(conv(x))
        for layer in self.decoder:
            x = layer(x)
        return x.clamp(-1, 1)

    def chunked(self, codes: torch.Tensor, chunk: int = 300, left_context: int = 25) -> torch.Tensor:
        """The reference's long-input decode: chunks of ``chunk`` frames, each with up to
        ``left_context`` frames before it whose samples are dropped."""
        pieces, start = [], 0
        while start < codes.shape[-1]:
            end = min(start + chunk, codes.shape[-1])
            context = left_context if start - left_context > 0 else start
            pieces.append(self(codes[..., start - context : end])[..., context * self.samples_per_frame :])
            start = end
        return torch.cat(pieces, dim=-1)


class SpeechTokenizer(nn.Module):
    """The decoding half of ``speech_tokenizer/model.safetensors``: its ``decoder.*`` tensors
    (the encoding half: :class:`~mm_pack_qwen3tts.encoder.SpeechEncoder`)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.sample_rate = int(cfg.get("output_sample_rate", 24000))
        self.decoder = CodecDecoder(cfg.get("decoder_config", {}))

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """F x Q codes of one utterance -> a waveform of F x samples_per_frame samples."""
        return self.decoder.chunked(codes.T[None].clamp(min=0))[0, 0]
