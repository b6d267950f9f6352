"""BAGEL: the MoT decoder (:mod:`mm_pack_bagel.decoder`), the NaViT understanding tower and its
connector (:mod:`mm_pack_bagel.vision`), and the generation heads on FLUX latents.

One packed row holds several samples; each is a sequence of splits (text, a ViT image, a VAE
image). Text and ViT tokens go through the understanding expert, latent tokens through the
generation expert. Training computes, as the reference's ``Bagel.forward``:

- text: cross-entropy of ``lm_head`` at ``ce_loss_indexes`` against ``packed_label_ids``;
- images to generate: flow matching. The clean latent ``x0`` (patchified ``p x p``) is mixed
  with Gaussian noise ``x1`` at ``t = shift * s / (1 + (shift - 1) * s)``, ``s = sigmoid(raw)``
  of a Gaussian ``raw`` per image (``-inf``: a clean conditioning image), fed as
  ``vae2llm(x_t) + timestep embedding + latent position``, and ``llm2vae`` of the decoder's
  output at ``mse_loss_indexes`` regresses the velocity ``x1 - x0``.

:func:`loss` reduces the two as the reference's training script does on one device:
``ce.sum() / n_ce_tokens * ce_weight + mse.mean(-1).sum() / n_mse_tokens * mse_weight``.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from mm_pack_bagel.config import BagelConfig
from mm_pack_bagel.decoder import MoTForCausalLM, block_mask
from mm_pack_bagel.vision import MLPConnector, NaViTModel, PositionEmbedding, TimestepEmbedder


class Bagel(nn.Module):
    def __init__(self, config: BagelConfig) -> None:
        super().__init__()
        if config.llm.layer_module != "Qwen2MoTDecoderLayer":
            raise ValueError(f"layer_module {config.llm.layer_module!r}: only BAGEL's Mixture-of-Transformers layer (Qwen2MoTDecoderLayer) is built here")
        self.config = config
        hidden = config.llm.hidden_size
        self.language_model = MoTForCausalLM(config.llm)
        if config.visual_und:
            self.vit_model = NaViTModel(config.vit)
            self.connector = MLPConnector(config.vit.hidden_size, hidden, config.connector_act)
            self.vit_pos_embed = PositionEmbedding(config.vit_max_num_patch_per_side, hidden)
        if config.visual_gen:
            self.time_embedder = TimestepEmbedder(hidden)
            self.vae2llm = nn.Linear(config.patch_latent_dim, hidden)
            self.llm2vae = nn.Linear(hidden, config.patch_latent_dim)
            self.latent_pos_embed = PositionEmbedding(config.max_latent_size, hidden)

    @classmethod
    def from_pretrained(cls, folder: Any) -> "Bagel":
        """A release-layout folder, strictly (:func:`mm_pack_bagel.checkpoint.load_model`)."""
        from mm_pack_bagel.checkpoint import load_model

        return load_model(folder)

    # -- pieces a training step and the sampler share --------------------------------------

    def flow_time(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw Gaussian draws -> flow times in (0, 1), shifted by ``timestep_shift``."""
        s = torch.sigmoid(raw)
        shift = self.config.timestep_shift
        return shift * s / (1 + (shift - 1) * s)

    def latent_tokens(self, x_t: torch.Tensor, t: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.vae2llm(x_t) + self.time_embedder(t) + self.latent_pos_embed(position_ids)

    def vit_tokens(self, patches: torch.Tensor, position_ids: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
        features = self.connector(self.vit_model(patches, position_ids, seqlens))
        return features + self.vit_pos_embed(position_ids)

    def patchify_latents(self, latents: list[torch.Tensor] | torch.Tensor, shapes: list[tuple[int, int]]) -> torch.Tensor:
        """Each ``[c, >=h*p, >=w*p]`` latent -> ``[h*w, p*p*c]`` tokens (row-major; (row, col, channel) in a patch)."""
        p, c = self.config.latent_patch_size, self.config.latent_channels
        tokens = []
        for latent, (h, w) in zip(latents, shapes):
            patch = latent[:, : h * p, : w * p].reshape(c, h, p, w, p)
            tokens.append(patch.permute(1, 3, 2, 4, 0).reshape(h * w, p * p * c))
        return torch.cat(tokens)

    def unpatchify_latent(self, tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
        p, c = self.config.latent_patch_size, self.config.latent_channels
        return tokens.reshape(h, w, p, p, c).permute(4, 0, 2, 1, 3).reshape(c, h * p, w * p)

    def embed_row(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The packed row's embeddings: text tokens and ViT features in place; latent rows zero."""
        text = self.language_model.model.embed_tokens(batch["packed_text_ids"])
        sequence = text.new_zeros(batch["sequence_length"], text.shape[-1])
        sequence[batch["packed_text_indexes"]] = text
        if self.config.visual_und and batch.get("packed_vit_tokens") is not None:
            vit = self.vit_tokens(batch["packed_vit_tokens"], batch["packed_vit_position_ids"], [int(n) for n in batch["vit_token_seqlens"]])
            sequence[batch["packed_vit_token_indexes"]] = vit.to(sequence.dtype)
        return sequence

    def decode_row(self, sequence: torch.Tensor, batch: Mapping[str, Any], gen: torch.Tensor) -> torch.Tensor:
        """The decoder over a packed row of embeddings: its final hidden states."""
        und = batch["packed_text_indexes"]
        if batch.get("packed_vit_token_indexes") is not None:
            und = torch.cat([und, batch["packed_vit_token_indexes"]])
        mask = block_mask(batch["sample_lens"], batch["split_lens"], batch["attn_modes"], sequence.device)
        return self.language_model.model(sequence, batch["packed_position_ids"], und, gen, mask)

    # -- training ---------------------------------------------------------------------------

    def forward(self, batch: Mapping[str, Any], noise: torch.Tensor | None = None) -> dict[str, torch.Tensor | None]:
        """Per-token CE, per-element MSE and the predicted velocities of one packed row.

        ``batch`` holds the reference's packed fields (:func:`mm_pack_bagel.packing.pack`);
        ``noise`` (the flow's ``x1``) is drawn with ``torch.randn_like`` when not given.
        """
        sequence = self.embed_row(batch)
        touch = self.untouched_parts(batch, sequence)
        gen = batch.get("packed_vae_token_indexes")
        velocity = mse = None
        if self.config.visual_gen and gen is not None and gen.numel():
            clean = self.patchify_latents(batch["padded_latent"], batch["patchified_vae_latent_shapes"])
            noise = torch.randn_like(clean) if noise is None else noise
            t = self.flow_time(batch["packed_timesteps"])
            x_t = (1 - t[:, None]) * clean + t[:, None] * noise
            sequence[gen] = self.latent_tokens(x_t, t, batch["packed_latent_position_ids"]).to(sequence.dtype)
        else:
            gen = torch.zeros(0, dtype=torch.long, device=sequence.device)
        hidden = self.decode_row(sequence, batch, gen)
        if gen.numel() and batch.get("mse_loss_indexes") is not None:
            velocity = self.llm2vae(hidden[batch["mse_loss_indexes"]])
            # the velocity points from data to noise; clean (t = 0) conditioning images carry no loss
            mse = (velocity - (noise - clean)[t > 0]) ** 2
        ce = None
        if batch.get("ce_loss_indexes") is not None:
            logits = self.language_model.lm_head(hidden[batch["ce_loss_indexes"]])
            ce = F.cross_entropy(logits.float(), batch["packed_label_ids"], reduction="none")
        return {"ce": ce, "mse": mse, "velocity": velocity, "touch": touch}

    def untouched_parts(self, batch: Mapping[str, Any], sequence: torch.Tensor) -> torch.Tensor:
        """Zero times the parts this row does not use (the tower without images, the generation
        heads without pictures, the text head without text targets): under FSDP2 every rank
        then runs the same sharded modules and gives the same parameters gradients, whatever
        its micro-batch holds (a tower called on one rank only hangs or kills the step)."""
        zero = sequence.new_zeros(())
        if not (self.training and torch.is_grad_enabled()):
            return zero
        hidden = self.config.llm.hidden_size
        if self.config.visual_und and batch.get("packed_vit_tokens") is None:
            p = self.config.vit.patch_size
            patch = sequence.new_zeros(1, self.config.vit.num_channels * p * p)
            zero = zero + 0.0 * self.vit_tokens(patch, torch.zeros(1, dtype=torch.long, device=sequence.device), [1]).sum()
        gen = batch.get("packed_vae_token_indexes")
        if self.config.visual_gen and (gen is None or not gen.numel() or batch.get("mse_loss_indexes") is None):
            probe = sequence.new_zeros(1, hidden)
            t = sequence.new_zeros(1)
            zero = zero + 0.0 * (self.latent_tokens(sequence.new_zeros(1, self.config.patch_latent_dim), t, torch.zeros(1, dtype=torch.long, device=sequence.device)).sum() + self.llm2vae(probe).sum())
        if batch.get("ce_loss_indexes") is None:
            zero = zero + 0.0 * self.language_model.lm_head(sequence.new_zeros(1, hidden)).sum()
        return zero


def loss(out: Mapping[str, torch.Tensor | None], ce_weight: float = 1.0, mse_weight: float = 1.0) -> torch.Tensor:
    """The reference's training loss on one device: token-mean CE plus token-mean MSE (each
    token's MSE averaged over its latent channels), with its default weights 1 and 1."""
    total = out["touch"] if out.get("touch") is not None else torch.zeros(())
    if out["ce"] is not None and out["ce"].numel():
        total = total + out["ce"].sum() / out["ce"].numel() * ce_weight
    if out["mse"] is not None and out["mse"].numel():
        total = total + out["mse"].mean(dim=-1).sum() / out["mse"].shape[0] * mse_weight
    return total
