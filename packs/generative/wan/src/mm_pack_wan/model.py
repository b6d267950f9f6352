"""Wan's side of training: the flow-matching objective on (cached or freshly encoded) latents."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mmcore.context import StageContext
from mmcore.data.shards import ShardDataset
from mmcore.errors import StageError
from mmcore.rundir import Manifest
from mmcore.train import TrainRecipe, load_converted

FREEZE_GROUPS = {
    "blocks": ["blocks.*"],
    "embeddings": ["patch_embedding.*", "condition_embedder.*"],
    "head": ["proj_out.*", "norm_out.*", "scale_shift_table"],
}


def build_transformer(model_dir: Path, checkpoint: Path | None = None) -> Any:
    from diffusers import WanTransformer3DModel

    config = WanTransformer3DModel.load_config(model_dir / "transformer")
    model = WanTransformer3DModel.from_config(config)
    if checkpoint is not None:
        load_converted(model, checkpoint)
    return model


def sigmas(batch: int, cfg: Any, generator: Any = None) -> Any:
    """Noise levels in (0, 1): uniform or logit-normal, then shifted as Wan's scheduler shifts them."""
    import torch

    u = torch.sigmoid(torch.randn(batch, generator=generator)) if cfg.timestep_sampling == "logit_normal" else torch.rand(batch, generator=generator)
    return cfg.flow_shift * u / (1 + (cfg.flow_shift - 1) * u)


def flow_matching_loss(model: Any, latents: Any, text: Any, empty_text: Any, cfg: Any) -> Any:
    """Summed per-sample MSE between predicted and true velocity (noise - data) at random noise levels."""
    import torch

    batch = latents.shape[0]
    drop = torch.rand(batch) < cfg.caption_dropout
    text = torch.where(drop.view(-1, 1, 1).to(text.device), empty_text.to(text.device).expand_as(text), text)
    sigma = sigmas(batch, cfg).to(latents.device)
    noise = torch.randn(latents.shape).to(latents.device)
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * latents + s * noise
    prediction = model(hidden_states=noisy, timestep=sigma * 1000, encoder_hidden_states=text, return_dict=False)[0]
    return ((prediction.float() - (noise - latents).float()) ** 2).mean(dim=(1, 2, 3, 4)).sum()


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    shapes = {tuple(s["latents"].shape if "latents" in s else s["frames"].shape) for s in samples}
    if len(shapes) > 1:
        raise StageError(f"a micro-batch mixes shapes {sorted(shapes)}; the sampler groups by bucket, so the cache and the preprocessed data disagree: rerun preprocess and extract with --force")
    batch: dict[str, Any] = {"num_loss_tokens": len(samples)}  # the loss is per sample
    if "latents" in samples[0]:
        batch["latents"] = torch.stack([s["latents"] for s in samples])
        batch["text"] = torch.stack([s["text"] for s in samples])
    else:
        batch["frames"] = [s["frames"] for s in samples]
        batch["captions"] = [s["caption"] for s in samples]
    return batch


class FreshSamples:
    """Preprocessed clips with their captions, encoded during training (no extract stage)."""

    def __init__(self, data: ShardDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"frames": self.data[i]["frames"], "caption": self.data.meta(i)["caption"]}


def recipe(ctx: StageContext, upstream: Mapping[str, Manifest]) -> TrainRecipe:
    """With a finished extract stage, train from its cache; without, encode every batch afresh."""
    cfg = ctx.config.training
    data = ShardDataset(upstream["preprocess"].output("dataset"))
    if "extract" in upstream:
        from mm_pack_wan.extract import CachedFeatures

        samples: Any = CachedFeatures(upstream["extract"].output("features"), list(range(len(data))))
        empty = samples.empty_text()
        encoders = None
    else:
        from mm_pack_wan.extract import Encoders

        samples = FreshSamples(data)
        encoders = Encoders(upstream["download"].output("model"), ctx.config.data.max_sequence_length)
        empty = encoders.text("")

    def loss(model: Any, batch: dict[str, Any]) -> Any:
        import torch

        if encoders is not None:
            batch = dict(batch)
            batch["latents"] = torch.stack([encoders.latents(f) for f in batch["frames"]])
            batch["text"] = torch.stack([encoders.text(c) for c in batch["captions"]])
        device = next(model.parameters()).device
        return flow_matching_loss(model, batch["latents"].to(device), batch["text"].to(device), empty, cfg)

    return TrainRecipe(
        build_model=lambda ctx, upstream: build_transformer(upstream["download"].output("model"), upstream["convert"].output("checkpoint")),
        dataset=lambda ctx, upstream: samples,
        collate=collate,
        loss=loss,
        shard_modules=lambda model: list(model.blocks),
        freeze_groups=FREEZE_GROUPS,
        loss_unit="samples",
        group_of=lambda i: tuple(data.meta(i)["bucket"]),  # latents of one micro-batch must stack
    )
