"""The Qwen3-TTS talker: a transformers ``Qwen3Model`` stack fed embeddings (text channel +
codec channel summed), the codec head for the first codebook, and the code predictor (a second,
small ``Qwen3Model``) for the other ``num_code_groups - 1`` codebooks of each 12.5 Hz frame.

Parameter names equal the public ``model.safetensors`` keys under ``talker.``:
``model.{layers.N.*, norm, codec_embedding, text_embedding}``, ``text_projection.linear_fc1/2``,
``codec_head``, ``code_predictor.model.{layers.N.*, norm, codec_embedding.K}``,
``code_predictor.lm_head.K``, ``code_predictor.small_to_mtp_projection`` (only where the two
widths differ). Neither stack has an ``embed_tokens``: transformers' one is removed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mm_pack_qwen3tts.config import backbone_config


def embeddings_only_qwen3(config) -> nn.Module:  # type: ignore[no-untyped-def]
    """transformers' ``Qwen3Model`` without its token table (inputs are ``inputs_embeds``)."""
    from transformers import Qwen3Model

    model = Qwen3Model(config)
    model.embed_tokens = None  # a None submodule leaves the state dict
    return model


def run_stack(stack: nn.Module, embeds: torch.Tensor, *, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = False):  # type: ignore[no-untyped-def]
    """Hidden states (and the cache) of a ``Qwen3Model`` fed embeddings, through transformers' KV cache."""
    from mmcore.engines import cached_forward

    out, new_cache = cached_forward(stack, cache, use_cache=use_cache, inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids)
    return out.last_hidden_state, new_cache


class ResizeMLP(nn.Module):
    """``text_projection``: text_hidden -> text_hidden -> hidden, with biases and the talker's activation."""

    def __init__(self, size_in: int, size_mid: int, size_out: int, act: str) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.linear_fc1 = nn.Linear(size_in, size_mid, bias=True)
        self.linear_fc2 = nn.Linear(size_mid, size_out, bias=True)
        self.act_fn = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class CodePredictor(nn.Module):
    """Codebooks 1..G-1 of one frame from the talker's hidden state and codebook 0: a causal pass
    over ``[hidden, embed(c0), embed_1(c1), ...]`` (positions 0.. per frame), head K-1 reading
    position K predicts codebook K."""

    def __init__(self, section: dict[str, Any], talker_hidden: int, groups: int) -> None:
        super().__init__()
        config = backbone_config(section, "talker_config.code_predictor_config")
        vocab, hidden = int(section.get("vocab_size", 2048)), config.hidden_size
        self.groups = groups
        self.model = embeddings_only_qwen3(config)
        self.model.codec_embedding = nn.ModuleList([nn.Embedding(vocab, talker_hidden) for _ in range(groups - 1)])
        self.lm_head = nn.ModuleList([nn.Linear(hidden, vocab, bias=False) for _ in range(groups - 1)])
        self.small_to_mtp_projection = nn.Linear(talker_hidden, hidden, bias=True) if hidden != talker_hidden else nn.Identity()

    def embed(self, k: int, codes: torch.Tensor) -> torch.Tensor:
        """The talker-width embedding of codebook ``k`` >= 1."""
        return self.model.codec_embedding[k - 1](codes)

    def step(self, embeds: torch.Tensor, cache: Any = None):  # type: ignore[no-untyped-def]
        return run_stack(self.model, self.small_to_mtp_projection(embeds), cache=cache, use_cache=True)

    def teacher_forced_logits(self, talker_hidden: torch.Tensor, codes: torch.Tensor, code0_embed: torch.Tensor) -> torch.Tensor:
        """``talker_hidden`` N x H, ``codes`` N x G, ``code0_embed`` N x H -> logits N x (G-1) x V
        (row K-1 predicts codebook K)."""
        parts = [talker_hidden[:, None], code0_embed[:, None]] + [self.embed(k, codes[:, k : k + 1]) for k in range(1, self.groups - 1)]
        hidden, _ = run_stack(self.model, self.small_to_mtp_projection(torch.cat(parts, dim=1)))
        return torch.stack([self.lm_head[k](hidden[:, k + 1]) for k in range(self.groups - 1)], dim=1)


class Talker(nn.Module):
    def __init__(self, talker: dict[str, Any]) -> None:
        super().__init__()
        config = backbone_config(talker, "talker_config")
        hidden = config.hidden_size
        text_hidden = int(talker.get("text_hidden_size", 2048))
        self.groups = int(talker.get("num_code_groups", 32))
        self.model = embeddings_only_qwen3(config)
        self.model.codec_embedding = nn.Embedding(int(talker.get("vocab_size", 3072)), hidden)
        self.model.text_embedding = nn.Embedding(int(talker.get("text_vocab_size", 151936)), text_hidden)
        self.text_projection = ResizeMLP(text_hidden, text_hidden, hidden, config.hidden_act)
        self.codec_head = nn.Linear(hidden, int(talker.get("vocab_size", 3072)), bias=False)
        self.code_predictor = CodePredictor(talker.get("code_predictor_config") or {}, hidden, self.groups)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(ids))

    def frame_embed(self, codes: torch.Tensor) -> torch.Tensor:
        """A frame's codec-channel input: the sum of its G codebooks' embeddings (... x G -> ... x H)."""
        out = self.model.codec_embedding(codes[..., 0])
        for k in range(1, self.groups):
            out = out + self.code_predictor.embed(k, codes[..., k])
        return out

    def hidden(self, embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced last hidden states; positions count the unmasked tokens (left padding
        allowed), as the reference's ``get_rope_index``."""
        positions = None
        if attention_mask is not None:
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return run_stack(self.model, embeds, attention_mask=attention_mask, position_ids=positions)[0]
