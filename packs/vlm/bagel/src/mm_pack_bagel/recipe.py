"""BAGEL's part of training for the train engine (:class:`mmcore.train.TrainRecipe`).

A micro-batch is one packed row of its samples (:func:`mm_pack_bagel.packing.pack`). Each
sample's randomness (its latent drawn from the stored posterior, its Gaussian timestep, its
noise) comes from a generator seeded by ``batch["sample_seeds"]``, so a step does not depend
on how samples fall into micro-batches or ranks.

The loss is the reference's: token-mean cross-entropy plus latent-token-mean velocity MSE
(each latent token's MSE averaged over its channels), each mean over the step's whole batch
(every micro-batch and rank), as :func:`mm_pack_bagel.model.loss` computes it on one device:
the two are the recipe's ``loss_terms``, each divided by its own count
(:func:`mmcore.train.loss_of_terms`), so the step's loss does not depend on how samples fall
into micro-batches and ranks.

Caption dropout (``training.caption_dropout``, the reference's ``text_cond_dropout_prob``): a
caption -> picture sample is trained, with that probability, without its prompt's loss-free text
items, as the reference's packer skips a ``enable_cfg`` text item; what is left is the row the
sampler's unconditional branch packs. The draw comes from the sample's seed after its latent,
timestep and noise, so those stay what they are without dropout; the row is packed again without
the dropped captions (their tokens carry no loss, so the loss counts do not change).

Modules sharded one by one (FSDP2): the decoder's MoT layers and the ViT's layers; the model
is single-device code, every layer runs both experts' parameters on every row (a row without
a picture still gives the generation expert a zero-sized pass), so ranks call the same modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from mmcore import Manifest, StageContext
from mmcore.data import MediaKinds
from mmcore.train import TrainRecipe, loss_of_terms

FREEZE_GROUPS = {
    "vision": ["vit_model.*"],
    "connector": ["connector.*"],
    "llm": ["language_model.*"],
    "generation": ["time_embedder.*", "vae2llm.*", "llm2vae.*", "language_model.model.layers.*_moe_gen.*", "language_model.model.norm_moe_gen.*"],
}

# the media a stored sample holds (preprocess's ``media`` meta), by kind
MEDIA = {"pixel_values": "image", "latent_mean": "picture"}

# LoRA's default layers: both experts' attention and MLP projections.
LORA_TARGETS = (
    "language_model.model.layers.*.self_attn.*_proj",
    "language_model.model.layers.*.self_attn.*_proj_moe_gen",
    "language_model.model.layers.*.mlp.*_proj",
    "language_model.model.layers.*.mlp_moe_gen.*_proj",
)


class BagelRecipe(TrainRecipe):
    freeze_groups = FREEZE_GROUPS
    lora_targets = LORA_TARGETS
    sample_seeds = True
    loss_terms = ("ce", "mse")

    def __init__(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> None:
        from mmcore.data import ShardDataset

        super().__init__()
        self.model_dir = Path(upstream["download"].output("model"))
        self.data = ShardDataset(upstream["preprocess"].output("dataset"))
        self.ids = {k: int(v) for k, v in self.data.index["tokens"].items()}  # recorded by preprocess
        self.config = None
        # every tower and head runs on every rank (zero-weighted where unused: no fillers); the
        # engine only counts the steps whose ranks held different media
        train = self.data.split("train")
        self.media = MediaKinds(tuple(MEDIA.values()), lambda i: {MEDIA[m] for m in train.meta(i).get("media", ())})
        self.caption_dropout = float(getattr(ctx.config.training, "caption_dropout", 0.0))

    def build_model(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        """The model without weights: the engine loads convert's DCP copy into it (sharded)."""
        from mm_pack_bagel.config import load_config
        from mm_pack_bagel.model import Bagel

        self.config = load_config(self.model_dir)
        return Bagel(self.config)

    def weights(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Path:  # type: ignore[override]
        return upstream["convert"].output("checkpoint")

    def shard_modules(self, model: Any) -> list[Any]:
        return [*model.language_model.model.layers, *model.vit_model.vision_model.encoder.layers]

    def dataset(self, ctx: StageContext, upstream: Mapping[str, Manifest]) -> Any:
        return self.data.split("train")

    def length_of(self, i: int) -> int:  # type: ignore[override]
        return self.data.split("train").length(i)

    def _pack(self, rows: list[list[dict[str, Any]]]) -> dict[str, Any]:
        from mm_pack_bagel.packing import pack

        if self.config is None:
            from mm_pack_bagel.config import load_config

            self.config = load_config(self.model_dir, with_vae=True)
        c = self.config
        return pack(rows, self.ids, vit_patch=c.vit.patch_size, vit_max_per_side=c.vit_max_num_patch_per_side, latent_patch=c.latent_patch_size, max_latent_size=c.max_latent_size)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        from mm_pack_bagel.data import items_of

        rows = [items_of(s, self.ids) for s in samples]
        batch = self._pack(rows)
        if self.caption_dropout > 0 and any(row and row[-1]["type"] == "vae" for row in rows):
            batch["rows"] = rows  # loss() packs them again without the captions it drops
        # which sample each latent belongs to, and its posterior's std, for the per-sample draws in loss()
        batch["latent_std"] = [s["latent_std"][0] for s in samples if "latent_std" in s]
        batch["latent_owner"] = [i for i, s in enumerate(samples) if "latent_std" in s]
        ce = len(batch.get("ce_loss_indexes", []))
        mse = 0 if batch.get("mse_loss_indexes") is None else len(batch["mse_loss_indexes"])
        batch["loss_counts"] = {"ce": ce, "mse": mse}
        batch["num_loss_tokens"] = ce + mse  # the throughput's unit
        return batch

    def loss(self, model: Any, batch: dict[str, Any]) -> torch.Tensor:
        noise = None
        if batch.get("padded_latent"):
            seeds = batch.get("sample_seeds")
            latents, draws, noises, generators = [], [], [], []
            for mean, std, owner in zip(batch["padded_latent"], batch["latent_std"], batch["latent_owner"]):
                g = torch.Generator().manual_seed(int(seeds[owner]) if seeds is not None else owner)
                generators.append(g)
                latents.append(mean + std * torch.randn(mean.shape, generator=g))
                draws.append(torch.randn((), generator=g))
                h, w = mean.shape[1] // self.config.latent_patch_size, mean.shape[2] // self.config.latent_patch_size
                noises.append(torch.randn(h * w, self.config.patch_latent_dim, generator=g))
            device = next(model.parameters()).device
            dropped = [owner for owner, g in zip(batch["latent_owner"], generators) if self.caption_dropout > 0 and float(torch.rand((), generator=g)) < self.caption_dropout]
            if dropped:
                batch = self._without_captions(batch, set(dropped), device)
            sizes = [int(h) * int(w) for h, w in batch["patchified_vae_latent_shapes"]]
            batch = dict(batch, padded_latent=[x.to(device) for x in latents], packed_timesteps=torch.cat([d.repeat(n) for d, n in zip(draws, sizes)]).to(device))
            noise = torch.cat(noises).to(device)
        out = model(batch, noise=noise)
        ce = out["touch"] + (out["ce"].sum() if out["ce"] is not None else 0.0)  # touch: zero times the unused parts
        mse = out["mse"].mean(dim=-1).sum() if out["mse"] is not None else torch.zeros((), device=ce.device)
        return loss_of_terms(batch, {"ce": ce, "mse": mse})

    def _without_captions(self, batch: dict[str, Any], dropped: set[int], device: Any) -> dict[str, Any]:
        """``batch`` packed again with the loss-free text items of the samples in ``dropped``
        (caption -> picture samples) left out; the engine's fields (seeds, counts) kept."""
        rows = [[item for item in row if not (n in dropped and item["type"] == "text" and not item["loss"])] for n, row in enumerate(batch["rows"])]
        again = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self._pack(rows).items()}
        return {**batch, **again}


def recipe(ctx: StageContext, upstream: Mapping[str, Manifest]) -> BagelRecipe:
    return BagelRecipe(ctx, upstream)
