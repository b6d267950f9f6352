"""The CosyVoice3 speech-token language model: a transformers ``Qwen2ForCausalLM`` backbone fed
embeddings, CosyVoice's speech-token embedding table and its decoder head.

Parameter names equal the public ``llm.pt`` keys (``llm.model.model.layers.0...``,
``llm.model.lm_head.weight``, ``llm_decoder.weight``, ``speech_embedding.weight``). The special
tokens live in the speech table past the ``speech_token_size`` codes: sos = S, eos = S + 1,
task_id = S + 2, fill = S + 3, and every id in [S, S + 200) stops decoding.
"""

from __future__ import annotations

import math
import random
from typing import Iterator

import torch
from torch import nn

from mm_pack_cosyvoice3.config import LMConfig

IGNORE_ID = -1
SPECIAL_TOKENS = 200


class Qwen2Encoder(nn.Module):
    """``llm.model`` is transformers' ``Qwen2ForCausalLM``; CosyVoice reads its last hidden state."""

    def __init__(self, qwen_config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        from transformers import Qwen2ForCausalLM

        self.model = Qwen2ForCausalLM(qwen_config)

    def forward(self, embeds: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        mask = torch.arange(embeds.shape[1], device=embeds.device)[None] < lengths[:, None]
        return self.model.model(inputs_embeds=embeds, attention_mask=mask.long()).last_hidden_state

    def step(self, embeds: torch.Tensor, cache):  # type: ignore[no-untyped-def]
        """One decoding step through transformers' KV cache: hidden states and the new cache."""
        from mmcore.engines import cached_forward

        out, cache = cached_forward(self.model.model, cache, inputs_embeds=embeds)
        return out.last_hidden_state, cache


class CosyVoice3LM(nn.Module):
    def __init__(self, cfg: LMConfig, qwen_config) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.cfg = cfg
        size = cfg.speech_token_size
        self.sos, self.eos_token, self.task_id, self.fill_token = size, size + 1, size + 2, size + 3
        self.llm = Qwen2Encoder(qwen_config)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, size + SPECIAL_TOKENS, bias=False)
        self.speech_embedding = nn.Embedding(size + SPECIAL_TOKENS, cfg.llm_input_size)

    def text_embedding(self, text: torch.Tensor) -> torch.Tensor:
        return self.llm.model.model.embed_tokens(text)

    def _special(self, token: int) -> torch.Tensor:
        return self.speech_embedding.weight[token].reshape(1, -1)

    def build_inputs(self, text, text_len, speech, speech_len, instruct=None, instruct_len=None, rng: random.Random | None = None):  # type: ignore[no-untyped-def]
        """Teacher forcing as the reference builds it. Unistream: ``[sos, instruct, text, task_id,
        speech]`` in, the speech tokens and eos as targets (everything before ignored). With
        ``rng``, each utterance draws once (``rng.random() < 0.5``, the reference's draw order) and,
        where speech/text exceeds ``mix_ratio[1] / mix_ratio[0]``, is built bistream instead:
        5 text tokens, their 15 speech tokens (then ``fill``), ..., the last text, task_id, the
        rest of the speech and eos. Without ``rng``: unistream only."""
        text_emb, speech_emb = self.text_embedding(text), self.speech_embedding(speech)
        instruct_emb = self.text_embedding(instruct) if instruct is not None else None
        inputs, targets = [], []
        for i in range(text.shape[0]):
            n_text, n_speech = int(text_len[i]), int(speech_len[i])
            n_inst = int(instruct_len[i]) if instruct is not None else 0
            parts, target = [self._special(self.sos)], [IGNORE_ID] * (1 + n_inst)
            if n_inst:
                parts.append(instruct_emb[i, :n_inst])
            draw = rng.random() if rng is not None else 1.0
            if draw < 0.5 and n_speech / n_text > self.cfg.mix_ratio[1] / self.cfg.mix_ratio[0]:
                self._bistream(parts, target, text[i, :n_text], text_emb[i, :n_text], speech[i, :n_speech], speech_emb[i, :n_speech])
            else:
                parts += [text_emb[i, :n_text], self._special(self.task_id), speech_emb[i, :n_speech]]
                target += [IGNORE_ID] * n_text + speech[i, :n_speech].tolist() + [self.eos_token]
            inputs.append(torch.cat(parts))
            targets.append(torch.tensor(target, device=text.device))
        lengths = torch.tensor([x.shape[0] for x in inputs], device=text.device)
        embeds = nn.utils.rnn.pad_sequence(inputs, batch_first=True, padding_value=IGNORE_ID)  # the reference pads with -1 too
        target = nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=IGNORE_ID)
        return embeds, lengths, target

    def _bistream(self, parts, target, text, text_emb, speech, speech_emb) -> None:  # type: ignore[no-untyped-def]
        n_t, n_s = self.cfg.mix_ratio
        for j in range(math.ceil((text.shape[0] + 1) / n_t)):
            chunk = text[j * n_t : (j + 1) * n_t]
            if chunk.shape[0] == n_t:
                target += [IGNORE_ID] * (n_t - 1) + speech[j * n_s : (j + 1) * n_s].tolist() + [self.fill_token]
                parts += [text_emb[j * n_t : (j + 1) * n_t], speech_emb[j * n_s : (j + 1) * n_s]]
            else:
                target += [IGNORE_ID] * chunk.shape[0] + speech[j * n_s :].tolist() + [self.eos_token]
                parts += [text_emb[j * n_t :], self._special(self.task_id), speech_emb[j * n_s :]]

    def forward(self, text, text_len, speech, speech_len, instruct=None, instruct_len=None, rng: random.Random | None = None) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
        embeds, lengths, target = self.build_inputs(text, text_len, speech, speech_len, instruct, instruct_len, rng)
        logits = self.llm_decoder(self.llm(embeds, lengths))
        loss = label_smoothing_loss(logits, target, self.cfg.lsm_weight, self.cfg.length_normalized_loss)
        keep = target != IGNORE_ID
        acc = (logits.argmax(-1)[keep] == target[keep]).float().mean()
        return {"loss": loss, "acc": acc, "logits": logits, "target": target}

    def prompt_embeds(self, text: torch.Tensor, prompt_speech: torch.Tensor | None = None) -> torch.Tensor:
        """``[sos, text, task_id, prompt speech]`` for one utterance (``text``: 1 x T ids)."""
        parts = [self._special(self.sos)[None], self.text_embedding(text), self._special(self.task_id)[None]]
        if prompt_speech is not None and prompt_speech.numel():
            parts.append(self.speech_embedding(prompt_speech))
        return torch.cat(parts, dim=1)

    @torch.inference_mode()
    def generate(
        self,
        text: torch.Tensor,
        prompt_speech: torch.Tensor | None = None,
        *,
        sampling: str = "ras",
        min_token_text_ratio: float = 2.0,
        max_token_text_ratio: float = 20.0,
        generator: torch.Generator | None = None,
    ) -> Iterator[int]:
        """Speech tokens for ``text`` (1 x T ids), one at a time, through transformers' KV cache.

        ``sampling``: ``"greedy"`` (argmax) or ``"ras"`` (CosyVoice's repetition-aware sampling:
        nucleus top-p/top-k, resampled from the full distribution when the pick repeats too often
        in the last ``win_size`` tokens). Before ``min_len`` tokens every stop token is masked."""
        n_text = text.shape[1]
        min_len, max_len = int(n_text * min_token_text_ratio), int(n_text * max_token_text_ratio)
        embeds, cache, out = self.prompt_embeds(text, prompt_speech), None, []
        size = self.cfg.speech_token_size
        for i in range(max_len):
            hidden, cache = self.llm.step(embeds, cache)
            logp = self.llm_decoder(hidden[:, -1]).float().log_softmax(-1)[0]
            if i < min_len:
                logp[size:] = -float("inf")
            token = int(logp.argmax()) if sampling == "greedy" else ras_sampling(logp, out, self.cfg, generator)
            if token >= size:
                return
            yield token
            out.append(token)
            embeds = self.speech_embedding.weight[token].reshape(1, 1, -1)


def label_smoothing_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float, normalize_length: bool) -> torch.Tensor:
    """KL to the smoothed one-hot target, summed, over non-ignored tokens (or over the batch)."""
    vocab, batch = logits.shape[-1], logits.shape[0]
    logits, target = logits.reshape(-1, vocab), target.reshape(-1)
    keep = target != IGNORE_ID
    logp = logits[keep].float().log_softmax(-1)
    true = torch.full_like(logp, smoothing / (vocab - 1))
    true.scatter_(1, target[keep][:, None], 1.0 - smoothing)
    kl = torch.where(true > 0, true * (true.clamp_min(1e-30).log() - logp), torch.zeros_like(logp)).sum()
    return kl / (keep.sum() if normalize_length else batch)


def ras_sampling(logp: torch.Tensor, decoded: list[int], cfg: LMConfig, generator: torch.Generator | None) -> int:
    """The reference's draws, in its order (``replacement=True`` draws as it does): nucleus
    (top-p mass before a token, at most top-k tokens), and if the pick occurs at least
    ``win_size * tau_r`` times in the last ``win_size`` tokens, a draw from the full distribution
    without it."""
    sorted_p, sorted_i = logp.softmax(0).sort(descending=True, stable=True)
    keep = (sorted_p.cumsum(0) - sorted_p) < cfg.top_p
    keep[cfg.top_k :] = False
    pick = int(sorted_i[keep][torch.multinomial(sorted_p[keep], 1, replacement=True, generator=generator)])
    if sum(1 for t in decoded[-cfg.win_size :] if t == pick) >= cfg.win_size * cfg.tau_r:
        scores = logp.clone()
        scores[pick] = -float("inf")
        pick = int(torch.multinomial(scores.softmax(0), 1, replacement=True, generator=generator))
    return pick
