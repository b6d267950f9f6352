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
the reference clips them). The loss is next-token cross-entropy over labels != -100.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from mm_pack_ming.audio import SanmEncoder, audio_projector
from mm_pack_ming.config import MingConfig
from mm_pack_ming.moe import AUDIO, IMAGE, TEXT, BailingMoeForCausalLM, attention_mask

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

    def embed(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings [B, L, H] with the media features in place, and each token's
        modality [B, L] (text, image, audio) for the decoder's routers."""
        table = self.model.model.word_embeddings
        ids = batch["input_ids"]
        embeds = table(ids.clamp(0, table.weight.shape[0] - 1))
        modality = torch.full_like(ids, TEXT)
        if batch.get("pixel_values") is not None:
            where = ids == self.image_token
            features = self.image_features(batch["pixel_values"], batch["image_grid_thw"])
            if int(where.sum()) != features.shape[0]:
                raise ValueError(f"{int(where.sum())} <imagePatch> tokens for {features.shape[0]} image features")
            embeds = embeds.masked_scatter(where[..., None], features.to(embeds.dtype))
            modality = modality.masked_fill(where, IMAGE)
        if batch.get("audio_feats") is not None:
            where = ids == int(batch["audio_token_id"])
            clips = torch.cat(self.audio_features(batch["audio_feats"], batch["audio_feats_lengths"]))
            if int(where.sum()) != clips.shape[0]:
                raise ValueError(f"{int(where.sum())} <audioPatch> tokens for {clips.shape[0]} audio frames")
            embeds = embeds.masked_scatter(where[..., None], clips.to(embeds.dtype))
            modality = modality.masked_fill(where, AUDIO)
        return embeds, modality

    def hidden_states(self, batch: Mapping[str, Any]) -> torch.Tensor:
        embeds, modality = self.embed(batch)
        ids = batch["input_ids"]
        segments = batch.get("segments")
        if segments is None:
            segments = batch["attention_mask"].long() if batch.get("attention_mask") is not None else torch.ones_like(ids)
        positions = batch.get("position_ids")
        if positions is None:
            positions = (segments > 0).long().cumsum(-1) - 1
        return self.model.model(embeds, positions.clamp(min=0), attention_mask(segments), modality)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Logits [B, L, V] (float32) and, with ``labels``, the per-token CE of the shifted
        targets (``ce`` [B, L - 1], zero where the label is -100) and their count."""
        logits = self.model.logits(self.hidden_states(batch))
        out = {"logits": logits}
        if batch.get("labels") is not None:
            targets = batch["labels"][:, 1:]
            ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="none")
            out["ce"] = ce.view(targets.shape)
            out["tokens"] = (targets != IGNORE).sum()
        return out


def mean_loss(out: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The reference's loss: CE averaged over the batch's target tokens."""
    return out["ce"].sum() / out["tokens"].clamp(min=1)
