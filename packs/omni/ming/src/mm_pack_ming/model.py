"""Ming-Lite-Omni's understanding side (``BailingMMNativeForConditionalGeneration`` less its
talker), single-device code under the release's parameter names:

- ``vision``: the Qwen2.5-VL vision tower, transformers' ``Qwen2_5_VisionTransformerPretrainedModel``
  (its names are the reference ``qwen2_5_vit.py``'s: ``patch_embed.proj``, ``blocks.N.{norm1,
  norm2, attn.qkv, attn.proj, mlp.*}``, ``merger.{ln_q, mlp.0, mlp.2}``; the rotary frequencies
  are not stored);
- ``audio``: the SAN-M encoder (:mod:`mm_pack_ming.audio`);
- ``model``: the BailingMoe decoder and ``lm_head`` (:mod:`mm_pack_ming.moe`);
- ``linear_proj`` (Linear, then (mlp_depth - 1) x (GELU, Linear)) and ``linear_proj_audio``.

The merged-embedding forward is the reference's: a picture's merged patches go through
``linear_proj`` and are L2-normalised, then replace the ``<imagePatch>`` tokens in order; a
clip's encoder frames go through ``linear_proj_audio``, are L2-normalised (``norm_query_embeds``)
and replace its ``<audioPatch>`` tokens. Text tokens are embedded (ids clipped to the table as
the reference clips them). The loss is next-token cross-entropy, token mean over labels !=
-100 (the reference's ``CrossEntropyLoss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from mm_pack_ming.audio import SanmEncoder, audio_projector
from mm_pack_ming.config import MingConfig
from mm_pack_ming.moe import AUDIO, IMAGE, TEXT, BailingMoeForCausalLM, sample_mask

IGNORE = -100


class MingOmni(nn.Module):
    def __init__(self, config: MingConfig) -> None:
        super().__init__()
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

        self.config = config
        hidden = config.llm.hidden_size
        self.vision = Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config(), attn_implementation="sdpa")
        self.audio = SanmEncoder(config.sanm) if config.audio is not None else None
        self.model = BailingMoeForCausalLM(config.llm)
        parts: list[nn.Module] = [nn.Linear(config.vision["out_hidden_size"], hidden)]
        for _ in range(1, config.mlp_depth):
            parts += [nn.GELU(), nn.Linear(hidden, hidden)]
        self.linear_proj = nn.Sequential(*parts)
        if self.audio is not None:
            self.linear_proj_audio = audio_projector(config.audio, hidden, config.mlp_depth)

    @property
    def image_token(self) -> int:
        return int(self.config.llm.image_patch_token)

    def image_features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        merged = self.vision(pixel_values.to(self.vision.patch_embed.proj.weight.dtype), grid_thw=grid_thw).pooler_output
        return F.normalize(self.linear_proj(merged.float()).to(merged.dtype), dim=-1)

    def audio_features(self, feats: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """One [frames, hidden] tensor per clip (feats [clips, T, 560], lengths [clips])."""
        encoded = self.audio(feats, lengths)
        projected = self.linear_proj_audio(encoded.transpose(-1, -2)).transpose(-1, -2)
        if self.config.audio.norm_query_embeds:
            projected = F.normalize(projected, dim=-1)
        return [projected[i, : int(n)] for i, n in enumerate(lengths)]

    def embed(self, input_ids: torch.Tensor, media: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings [B, L, H] with the media features in place, and each token's
        modality [B, L] (text, image, audio) for the decoder's routers."""
        table = self.model.model.word_embeddings
        embeds = table(input_ids.clamp(0, table.weight.shape[0] - 1))
        modality = torch.full_like(input_ids, TEXT)
        # generate(): media tokens the model writes after the prompt are text, not media slots
        span = media.get("media_span")
        in_prompt = torch.ones_like(input_ids, dtype=torch.bool) if span is None else (torch.arange(input_ids.shape[1], device=input_ids.device) < span)[None].expand_as(input_ids)
        if media.get("pixel_values") is not None:
            where = (input_ids == self.image_token) & in_prompt
            features = self.image_features(media["pixel_values"], media["image_grid_thw"])
            if int(where.sum()) != features.shape[0]:
                raise ValueError(f"{int(where.sum())} <imagePatch> tokens for {features.shape[0]} image features")
            embeds = embeds.masked_scatter(where[..., None], features.to(embeds.dtype))
            modality = modality.masked_fill(where, IMAGE)
        if media.get("audio_feats") is not None:
            where = (input_ids == int(media["audio_token_id"])) & in_prompt
            clips = torch.cat(self.audio_features(media["audio_feats"], media["audio_feats_lengths"]))
            if int(where.sum()) != clips.shape[0]:
                raise ValueError(f"{int(where.sum())} <audioPatch> tokens for {clips.shape[0]} audio frames")
            embeds = embeds.masked_scatter(where[..., None], clips.to(embeds.dtype))
            modality = modality.masked_fill(where, AUDIO)
        return embeds, modality

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **media: Any,
    ) -> "MingOutput":
        """Logits [B, L, V] (float32) and, with ``labels``, the per-token CE of the shifted
        targets (``ce`` [B, L - 1], zero where the label is -100), their count and their mean
        (``loss``). Rows are right- or left-padded (``attention_mask``), or packed: positions
        restarting at 0 mark each sample's start, and attention stays within a sample.
        ``media``: ``pixel_values``, ``image_grid_thw``, ``audio_feats``, ``audio_feats_lengths``,
        ``audio_token_id`` (other keyword arguments, ``use_cache`` say, are ignored)."""
        embeds, modality = self.embed(input_ids, media)
        valid = attention_mask.long() if attention_mask is not None else torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (valid.cumsum(-1) - 1).clamp(min=0)
            segments = valid
        else:
            position_ids = position_ids.reshape(input_ids.shape)
            segments = (position_ids == 0).long().cumsum(-1) * valid
        hidden = self.model.model(embeds, position_ids, sample_mask(segments), modality)
        logits = self.model.logits(hidden)
        if labels is None:
            return MingOutput(logits=logits)
        targets = labels[:, 1:]
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="none").view(targets.shape)
        tokens = (targets != IGNORE).sum()
        return MingOutput(loss=ce.sum() / tokens.clamp(min=1), logits=logits, ce=ce, tokens=tokens)

    @classmethod
    def from_pretrained(cls, folder: Any, **_: Any) -> "MingOmni":
        """A release-layout folder, strictly (:func:`mm_pack_ming.checkpoint.load_model`)."""
        from mm_pack_ming.checkpoint import load_model

        return load_model(folder)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 32,
        eos_token_id: Any = None,
        pad_token_id: int = 0,
        do_sample: bool = False,
        use_cache: bool = True,
        **media: Any,
    ) -> torch.Tensor:
        """Greedy (or, ``do_sample``, sampled at ``temperature``) decoding of left-padded
        prompts: the prompt once with its media, then one token a step against the cached keys
        and values (``use_cache=False``: the whole sequence recomputed each step, the same
        tokens). Returns prompt + new tokens; rows that ended are padded. Media tokens the model
        writes are text (only the prompt's are media slots)."""
        ends = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]) - {None}
        temperature = float(media.pop("temperature", 1.0) or 1.0)
        options = {k: media[k] for k in ("pixel_values", "image_grid_thw", "audio_feats", "audio_feats_lengths", "audio_token_id") if k in media}
        mask = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).long()
        ids, done = input_ids, torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        cache = [{} for _ in self.model.model.layers] if use_cache else None
        for step in range(max_new_tokens):
            if cache is None:
                last = self(ids, attention_mask=mask, media_span=input_ids.shape[1], **options).logits[:, -1]
            elif step == 0:
                embeds, modality = self.embed(ids, options)
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                hidden = self.model.model(embeds, positions, sample_mask(mask), modality, cache)
                last = self.model.logits(hidden[:, -1:])[:, 0]
            else:
                table = self.model.model.word_embeddings
                positions = mask.sum(-1, keepdim=True) - 1
                keys = mask.bool()[:, None, :]  # the new token sees every real token so far, itself included
                hidden = self.model.model(table(ids[:, -1:]), positions, keys, torch.full_like(ids[:, -1:], TEXT), cache)
                last = self.model.logits(hidden)[:, 0]
            token = torch.multinomial((last / temperature).softmax(-1), 1)[:, 0] if do_sample else last.argmax(-1)
            token = torch.where(done, torch.full_like(token, pad_token_id), token)
            ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, (~done).long()[:, None]], 1)
            done = done | torch.tensor([int(t) in ends for t in token], device=ids.device)
            if bool(done.all()):
                break
        return ids


@dataclass
class MingOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    ce: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
