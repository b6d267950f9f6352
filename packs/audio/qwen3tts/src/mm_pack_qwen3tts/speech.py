"""The talker's sequence layout, its teacher-forced loss and KV-cached code generation.

The layout is the reference's non-streaming one (its fine-tuning dataset and
``generate(non_streaming_mode=True)``, the default of its custom-voice and voice-design calls),
two channels summed per position (``streaming=True``: see :func:`layout`)::

    position   0..2      3 ..               then text       then       then frames 0..F-1   last
    text       role ids  pad .. pad  bos    text ids  eos   pad        pad ...              pad
    codec      -         think prefix [spk] pad       pad   bos        frame codes (all G)  eos

The think prefix is ``nothink, think_bos, think_eos`` (no language) or ``think, think_bos,
language, think_eos``; the speaker slot holds a CustomVoice speaker's codec id or a speaker
embedding. ``text_ids`` are the tokenised ``<|im_start|>assistant\\n{text}`` (role = first 3).
A frame's codec input is the sum of its G codebook embeddings.

Loss, consistent with decoding: the hidden state at position p predicts frame p+1's codebook 0
(``codec_head``, cross-entropy, eos included) and, through the code predictor, its codebooks
1..G-1; total = talker + 0.3 x code predictor, as the reference weighs them. (The reference's
``finetuning/sft_12hz.py`` hands pre-shifted labels to transformers' causal-LM loss, which
shifts again, and pairs frame p's codes with the hidden state at p; this module does not.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mm_pack_qwen3tts.config import SpecialIds
from mm_pack_qwen3tts.talker import Talker, run_stack

SUB_TALKER_WEIGHT = 0.3


@dataclass(frozen=True)
class Sampling:
    """The reference's defaults: top-k 50, top-p 1.0, temperature 0.9 (talker and code predictor)."""

    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9


@dataclass
class Layout:
    text: torch.Tensor  # T text-channel ids (-1: none)
    codec: torch.Tensor  # T codec-channel ids (-1: none)
    frames: torch.Tensor  # F x G codes, placed at positions first_frame ..
    first_frame: int
    speaker_at: int  # -1: no speaker slot
    speaker: torch.Tensor | None  # an embedding for the speaker slot
    trailing: list[int]  # streaming: the text ids read beside frames 0, 1, ... (then tts_pad)


def layout(ids: SpecialIds, text_ids: list[int], frames: torch.Tensor | None = None, *, speaker: int | torch.Tensor | None = None, language: int | None = None, streaming: bool = False) -> Layout:
    """``streaming``: the reference's ``non_streaming_mode=False`` (its voice-clone default): only
    the first text id goes before codec bos, the rest (then tts_eos) rides beside the frames."""
    prefix = [ids.codec_nothink, ids.codec_think_bos, ids.codec_think_eos] if language is None else [ids.codec_think, ids.codec_think_bos, language, ids.codec_think_eos]
    speaker_at = 3 + len(prefix) if speaker is not None else -1
    if speaker is not None:
        prefix.append(speaker if isinstance(speaker, int) else -1)
    prefix.append(ids.codec_pad)
    body = text_ids[3:]
    if not body:
        raise ValueError("text_ids: nothing to say after the 3 role ids")
    text = text_ids[:3] + [ids.tts_pad] * (len(prefix) - 1) + [ids.tts_bos]
    codec = [-1] * 3 + prefix
    if streaming:
        text, codec, trailing = text + body[:1], codec + [ids.codec_bos], body[1:] + [ids.tts_eos]
    else:
        text, codec, trailing = text + body + [ids.tts_eos, ids.tts_pad], codec + [ids.codec_pad] * (len(body) + 1) + [ids.codec_bos], []
    frames = frames if frames is not None else torch.zeros(0, ids.num_code_groups, dtype=torch.long)
    first = len(text)
    if len(frames):
        text += [trailing[k] if k < len(trailing) else ids.tts_pad for k in range(len(frames) + 1)]
        codec += [-1] * len(frames) + [ids.codec_eos]
    vector = speaker if isinstance(speaker, torch.Tensor) else None
    return Layout(torch.tensor(text), torch.tensor(codec), frames, first, speaker_at, vector, trailing)


def embed(talker: Talker, lay: Layout) -> torch.Tensor:
    """T x H input embeddings of a layout."""
    device = talker.codec_head.weight.device
    text_ids, codec_ids = lay.text.to(device), lay.codec.to(device)
    text = talker.text_embed(text_ids.clamp(min=0)) * (text_ids >= 0)[:, None]
    codec = talker.model.codec_embedding(codec_ids.clamp(min=0)) * (codec_ids >= 0)[:, None]
    out = text + codec
    if lay.speaker is not None:
        out = torch.cat([out[: lay.speaker_at], out[lay.speaker_at : lay.speaker_at + 1] + lay.speaker.to(out.dtype)[None], out[lay.speaker_at + 1 :]])
    if len(lay.frames):
        f = len(lay.frames)
        out = torch.cat([out[: lay.first_frame], out[lay.first_frame : lay.first_frame + f] + talker.frame_embed(lay.frames.to(device)), out[lay.first_frame + f :]])
    return out


def loss(talker: Talker, layouts: list[Layout], reduction: str = "mean") -> dict[str, torch.Tensor]:
    """Teacher-forced loss of a batch of layouts with frames (right-padded): ``loss`` (talker +
    0.3 x sub-talker), ``talker_loss`` (mean CE over codebook-0 targets, eos included) and
    ``sub_talker_loss`` (mean CE over codebooks 1..G-1 of every frame); ``hits`` and ``targets``:
    codebook-0 targets the logits' argmax hits, and their count; ``sub_hits`` and ``sub_targets``:
    the same for the code predictor's codebooks 1..G-1 (the frame's codebook 0 given). ``reduction="sum"`` (training:
    the engine divides by the targets of the whole step): ``loss`` = summed talker CE + 0.3 x
    each frame's code-predictor CE summed over frames and averaged over its G-1 codebooks."""
    seqs = [embed(talker, lay) for lay in layouts]
    length = max(len(s) for s in seqs)
    embeds = torch.stack([F.pad(s, (0, 0, 0, length - len(s))) for s in seqs])
    mask = torch.stack([torch.arange(length) < len(s) for s in seqs]).long().to(embeds.device)
    hidden = talker.hidden(embeds[:, :-1], mask[:, :-1])
    targets = torch.full((len(seqs), length), -100, dtype=torch.long)
    rows, before, codes = [], [], []
    for b, lay in enumerate(layouts):
        f = len(lay.frames)
        targets[b, lay.first_frame : lay.first_frame + f] = lay.frames[:, 0]
        targets[b, lay.first_frame + f] = lay.codec[lay.first_frame + f]
        rows += [b] * f
        before += list(range(lay.first_frame - 1, lay.first_frame + f - 1))
        codes.append(lay.frames)
    logits = talker.codec_head(hidden)
    targets = targets[:, 1:].to(logits.device)
    talker_loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction=reduction)
    frames = torch.cat(codes).to(logits.device)
    sub = talker.code_predictor.teacher_forced_logits(hidden[rows, before], frames, talker.model.codec_embedding(frames[:, 0]))
    sub_loss = F.cross_entropy(sub.flatten(0, 1).float(), frames[:, 1:].flatten(), reduction=reduction)
    if reduction == "sum":
        sub_loss = sub_loss / max(frames.shape[1] - 1, 1)
    valid = targets != -100
    hits = (logits.argmax(-1) == targets)[valid].sum()
    out = {"loss": talker_loss + SUB_TALKER_WEIGHT * sub_loss, "talker_loss": talker_loss, "sub_talker_loss": sub_loss, "hits": hits, "targets": valid.sum()}
    out["sub_hits"], out["sub_targets"] = (sub.argmax(-1) == frames[:, 1:]).sum(), frames[:, 1:].numel()
    out["logits"] = torch.cat([logits[valid].flatten(), sub.flatten()])  # every supervised logit, both levels
    return out


def batch_layouts(ids: SpecialIds, batch: dict[str, torch.Tensor]) -> list[Layout]:
    """The layouts of a collated batch (``text_ids`` / ``codes`` right-padded, their lengths,
    ``speaker`` / ``language`` ids or -1)."""
    out = []
    for b in range(len(batch["text_len"])):
        speaker, language = int(batch["speaker"][b]), int(batch["language"][b])
        text = batch["text_ids"][b, : int(batch["text_len"][b])].tolist()
        frames = batch["codes"][b, : int(batch["frames"][b])].cpu()
        out.append(layout(ids, text, frames, speaker=speaker if speaker >= 0 else None, language=language if language >= 0 else None))
    return out


def pick(logits: torch.Tensor, sampling: Sampling | None, generator: torch.Generator | None) -> int:
    """Greedy (``sampling=None``) or temperature / top-k / top-p sampling of one id from 1-D logits."""
    if sampling is None:
        return int(logits.argmax())
    scores = logits.float() / sampling.temperature
    if 0 < sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        order = torch.sort(scores, descending=True)
        cumulative = order.values.softmax(-1).cumsum(-1)
        drop = cumulative - order.values.softmax(-1) > sampling.top_p
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(0, order.indices, drop), float("-inf"))
    return int(torch.multinomial(scores.softmax(-1), 1, generator=generator))


@torch.inference_mode()
def generate_codes(
    talker: Talker,
    ids: SpecialIds,
    text_ids: list[int],
    *,
    speaker: int | torch.Tensor | None = None,
    language: int | None = None,
    streaming: bool = False,
    max_frames: int = 4096,
    min_frames: int = 2,
    sampling: Sampling | None = None,
    sub_sampling: Sampling | None = None,
    repetition_penalty: float = 1.05,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Codes (F x G) for ``text_ids``, one frame per step through transformers' KV cache: codebook 0
    from ``codec_head`` (the top 1024 ids but eos suppressed, eos masked for ``min_frames``, a
    repetition penalty over earlier codebook-0 ids), then the code predictor's G-1 steps (own cache,
    reset per frame); the next input is the frame's summed embedding + the text beside it (tts_pad
    when not ``streaming``, or once the text is read)."""
    talker.eval()
    lay = layout(ids, text_ids, speaker=speaker, language=language, streaming=streaming)
    prompt = embed(talker, lay)[None]
    beside = talker.text_embed(torch.tensor([lay.trailing + [ids.tts_pad]]))  # 1 x (len + 1) x H
    hidden, cache = run_stack(talker.model, prompt, cache=None, use_cache=True)
    vocab = talker.codec_head.out_features
    blocked = torch.zeros(vocab, dtype=torch.bool)
    blocked[max(vocab - 1024, 0) :] = True
    blocked[ids.codec_eos] = False
    frames: list[list[int]] = []
    for step in range(max_frames):
        h = hidden[:, -1:]
        logits = talker.codec_head(h)[0, -1].float().masked_fill(blocked, float("-inf"))
        if step < min_frames:
            logits[ids.codec_eos] = float("-inf")
        if repetition_penalty != 1.0 and frames:
            seen = torch.tensor(sorted({f[0] for f in frames}))
            values = logits[seen]
            logits[seen] = torch.where(values < 0, values * repetition_penalty, values / repetition_penalty)
        code0 = pick(logits, sampling, generator)
        if code0 == ids.codec_eos:
            break
        frame = [code0]
        sub_in, sub_cache = torch.cat([h, talker.model.codec_embedding(torch.tensor([[code0]]))], dim=1), None
        for k in range(1, talker.groups):
            sub_hidden, sub_cache = talker.code_predictor.step(sub_in, sub_cache)
            frame.append(pick(talker.code_predictor.lm_head[k - 1](sub_hidden[0, -1]), sub_sampling, generator))
            sub_in = talker.code_predictor.embed(k, torch.tensor([[frame[-1]]]))
        frames.append(frame)
        text = beside[:, min(step, beside.shape[1] - 1)][:, None]
        hidden, cache = run_stack(talker.model, talker.frame_embed(torch.tensor([[frame]])) + text, cache=cache, use_cache=True)
    return torch.tensor(frames, dtype=torch.long).reshape(-1, talker.groups)
