"""Step-LLM, Step-Video-T2V's bilingual text encoder (the release's ``step_llm/``), as this pack's
own single-device code: a causal decoder whose last hidden states (no final norm) are the
caption the DiT reads, written from the reference's ``stepvideo/text_encoder/stepllm.py`` and
``tokenizer.py`` (github.com/stepfun-ai/Step-Video-T2V).

A block: RMSNorm (the norm in float32, cast back, then the weight), grouped-query attention
(``wqkv`` holds every query head, then per key/value group its key and its value; each group
serves ``heads / groups`` consecutive query heads), residual; RMSNorm, SwiGLU (``w1`` gives the
gate then the up half, its width rounded up to a multiple of 256), residual. There is no
rotary or learned position: the reference's attention is StepFun's compiled ``Optimus`` kernel
(``torch.ops.Optimus.fwd``, causal, scale ``1/sqrt(head_dim)``), whose positions are ALiBi with
a square-root distance, ``-slope_h * sqrt(i - j)``, and the standard ALiBi slopes -- the math
of the fallback StepFun ships for the same kernel beside Step-1's weights elsewhere (Step-Audio's
``build_alibi_cache``). It is computed here with SDPA and that bias; the padding the tokenizer
appends is not masked (the reference passes the mask and its kernel ignores it: causal
attention keeps the prompt's own positions free of it, and the DiT masks the rest).

Tokens, as the reference's ``Wrapped_StepChatTokenizer``: the SentencePiece model
``step1_chat_tokenizer.model`` (kept in the folder beside the weights), ids 1 (BOS), the
prompt's pieces cut to ``max_length - 2``, 2 (EOS), padded with 2 to ``max_length`` (320).

Parameter names are the reference module's (``tok_embeddings.word_embeddings.weight``,
``transformer.layers.<i>.{attention.wqkv, attention.wo, feed_forward.w1, feed_forward.w2,
attention_norm, ffn_norm}.weight``); config fields its ``config.json``'s (``hidden_size``,
``num_attention_heads``, ``num_attention_groups``, ``ffn_hidden_size``, ``num_layers``,
``padded_vocab_size``, ``layernorm_epsilon``). The folder is read and written in that layout
(:mod:`mm_pack_stepvideo.stepllm_io`): a pipeline's ``text_encoder/`` may be the release's
``step_llm/`` as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from mmcore.kits import OwnFolderModel

BOS, EOS, PAD = 1, 2, 2  # the reference wrapper's, whatever the SentencePiece model says
MAX_LENGTH = 320


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes: ``2^(-8k/n)`` for the nearest power of two ``n`` below ``heads``,
    then the odd steps of ``2^(-4/n)`` for the rest."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = torch.pow(torch.tensor(2.0 ** (-8.0 / n)), torch.arange(1, n + 1))
    if n < heads:
        slopes = torch.cat([slopes, torch.pow(torch.tensor(2.0 ** (-4.0 / n)), torch.arange(1, 2 * (heads - n), 2))])
    return slopes


def alibi_bias(length: int, slopes: torch.Tensor, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """[heads, L, L]: ``-slope * sqrt(i - j)`` where key ``j`` <= query ``i``, ``-inf`` after."""
    i = torch.arange(length, device=device).view(-1, 1)
    j = torch.arange(length, device=device).view(1, -1)
    distance = (i - j).clamp(min=0).to(torch.float32)
    bias = -distance.sqrt() * slopes.to(device).view(-1, 1, 1)
    return bias.masked_fill(j > i, float("-inf")).to(dtype)


class StepLLMRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class StepLLMAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, groups: int) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = heads, groups, hidden // heads
        self.wqkv = nn.Linear(hidden, hidden + 2 * groups * self.head_dim, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, n, dim = x.shape
        q, kv = self.wqkv(x).split([dim, 2 * self.groups * self.head_dim], dim=-1)
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = kv.view(b, n, self.groups, 2 * self.head_dim).chunk(2, dim=-1)
        per_group = self.heads // self.groups
        k, v = (t.transpose(1, 2).repeat_interleave(per_group, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.wo(out.transpose(1, 2).reshape(b, n, dim))


class StepLLMFeedForward(nn.Module):
    def __init__(self, hidden: int, ffn_hidden: int, multiple_of: int = 256) -> None:
        super().__init__()
        width = multiple_of * math.ceil(ffn_hidden / multiple_of)
        self.w1 = nn.Linear(hidden, 2 * width, bias=False)
        self.w2 = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w1(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class StepLLMBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, groups: int, ffn_hidden: int, eps: float) -> None:
        super().__init__()
        self.attention = StepLLMAttention(hidden, heads, groups)
        self.feed_forward = StepLLMFeedForward(hidden, ffn_hidden)
        self.attention_norm = StepLLMRMSNorm(hidden, eps)
        self.ffn_norm = StepLLMRMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), bias)
        return h + self.feed_forward(self.ffn_norm(h))


class StepLLMEmbedding(nn.Module):
    """Only the word table (``tok_embeddings.word_embeddings``): positions come from ALiBi."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)


class StepLLMLayers(nn.Module):
    def __init__(self, blocks: list[StepLLMBlock]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(blocks)


@dataclass
class StepLLMOutput(BaseOutput):
    last_hidden_state: torch.Tensor


class StepLLM(OwnFolderModel, ModelMixin, ConfigMixin):
    """Step-LLM's decoder; ``tokenize`` is the reference wrapper's (the folder's SentencePiece model)."""

    _no_split_modules = ["StepLLMBlock"]

    @register_to_config
    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        num_attention_groups: int,
        ffn_hidden_size: int,
        num_layers: int,
        padded_vocab_size: int,
        layernorm_epsilon: float,
    ) -> None:
        super().__init__()
        if hidden_size % num_attention_heads or num_attention_heads % num_attention_groups:
            raise ValueError(f"Step-LLM config: hidden_size {hidden_size} / num_attention_heads {num_attention_heads} / num_attention_groups {num_attention_groups} do not divide")
        self.tok_embeddings = StepLLMEmbedding(padded_vocab_size, hidden_size)
        self.transformer = StepLLMLayers([StepLLMBlock(hidden_size, num_attention_heads, num_attention_groups, ffn_hidden_size, layernorm_epsilon) for _ in range(num_layers)])
        self.register_buffer("slopes", alibi_slopes(num_attention_heads), persistent=False)
        self.sentencepiece: Any = None  # set by the folder reader (stepllm_io), or set_tokenizer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> StepLLMOutput:
        """[B, L] ids -> ``last_hidden_state`` [B, L, hidden]. ``attention_mask`` is accepted and,
        as in the reference, not applied (see the module's docstring)."""
        x = self.tok_embeddings.word_embeddings(input_ids)
        bias = alibi_bias(input_ids.shape[1], self.slopes, x.dtype, x.device)
        for block in self.transformer.layers:
            x = block(x, bias)
        return StepLLMOutput(last_hidden_state=x)

    # -- tokens ------------------------------------------------------------------------------

    def set_tokenizer(self, model_proto: bytes) -> None:
        """The SentencePiece model (its serialized bytes: written back by ``save_pretrained``)."""
        import sentencepiece

        self.sentencepiece = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self.sentencepiece_proto = model_proto

    def tokenize(self, prompts: Sequence[str], max_length: int = MAX_LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) [B, max_length], as the reference's wrapper makes them."""
        if self.sentencepiece is None:
            raise ValueError("Step-LLM has no tokenizer: its folder lacks step1_chat_tokenizer.model")
        rows = [[BOS, *self.sentencepiece.encode_as_ids(p)[: max_length - 2], EOS] for p in prompts] or [[BOS, EOS]]
        ids = torch.tensor([r + [PAD] * (max_length - len(r)) for r in rows], dtype=torch.long)
        mask = torch.tensor([[1] * len(r) + [0] * (max_length - len(r)) for r in rows], dtype=torch.long)
        return ids, mask

    # -- the release's folder ----------------------------------------------------------------

    @classmethod
    def load_folder(cls, folder: Path, dtype: Any = None) -> StepLLM:
        from mm_pack_stepvideo.stepllm_io import load_stepllm

        return load_stepllm(Path(folder), dtype)

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> None:  # type: ignore[override]
        """The release's layout (what the pipeline's ``save_pretrained`` calls for ``text_encoder/``)."""
        from mm_pack_stepvideo.stepllm_io import save_released

        save_released(self, Path(save_directory))
